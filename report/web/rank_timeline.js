// memsnap report, rank page: the active memory timeline. Every large allocation a band stacked in
// allocation order (a freed band collapses, the bands above drop), the rest one summed band,
// reserved memory on top, batch boundaries, the peak and OOMs; an overview with a brush; zoom,
// pan, hover, pin and highlight (by category, stack, or a finding's allocations); #view=T0,T1.
'use strict';

window.memsnapRank.timeline = (function () {
  const M = window.memsnap;
  const { h, arr, num, str, fmtBytes, fmtExactBytes, fmtInt, fmtDur, fmtRel, fmtHex, fmtPct } = M;
  const R = window.memsnapRank;
  const {
    A, statsIn, stackFrames, topFrameText, categories, catShades, greyShades, catName, catColor,
    nBands, tMin, tMax, bSrc, bSize, bStart, bEnd, bCat, bStack, bEndDraw, geometry, vStart, vT, vO,
    lastLE, stepAt, bandOffsetAt, other, otherCount, hasOther, otherBand, reserved, allocatedTotal, batches, ooms, peakT, peakV, maxIn,
    bm, bmMethod, bmInferred, local,
  } = R;
  const sitesTable = () => (R.sites ? R.sites.table : null);

  const view = { t0: tMin, t1: tMax };
  let colorBy = 'category';
  let highlight = null; // {kind: 'stack'|'category', id} | {kind: 'set', mask, label}: a finding's allocations
  let marked = null; // the batch a finding names: {batch, t0, t1, label}
  let hover = null, pinned = null; // {type: 'band', b} | {type: 'other', t} | {type: 'oom', i}
  let hoverPos = null; // {x, y, t}
  let drag = null;
  let fitY = true;
  let yMaxFixed = 0;

  const tl = M.card('Active memory timeline', { id: 'timeline', hint: 'live allocations stacked in allocation order; a freed band collapses and the bands above drop' });
  const colorSeg = h('div', { class: 'seg', role: 'group', 'aria-label': 'colour bands by' });
  const btnCat = h('button', { class: 'on', onclick: () => setColorBy('category') }, 'Category');
  const btnStack = h('button', { onclick: () => setColorBy('stack') }, 'Stack');
  colorSeg.append(btnCat, btnStack);
  const fitBox = h('input', { type: 'checkbox', checked: true });
  fitBox.addEventListener('change', () => { fitY = fitBox.checked; schedule(); });
  const rangeLabel = h('span', { class: 'label mono' });
  const btnReset = h('button', { onclick: () => resetView(), title: 'show the whole window (double-click, 0)' }, 'Reset zoom');
  const toolbar = h('div', { class: 'toolbar' },
    h('span', { class: 'label' }, 'Colour by'), colorSeg,
    h('label', { class: 'check', title: 'scale the y axis to what is visible' }, fitBox, 'Fit y to view'),
    h('button', { class: 'icon', title: 'zoom in (W)', onclick: () => zoomAt((view.t0 + view.t1) / 2, 0.5) }, '+'),
    h('button', { class: 'icon', title: 'zoom out (S)', onclick: () => zoomAt((view.t0 + view.t1) / 2, 2) }, '−'),
    btnReset, rangeLabel, h('span', { class: 'grow' }),
    h('span', { class: 'label' }, 'wheel ', h('span', { class: 'kbd' }, 'zoom'), ' · drag ', h('span', { class: 'kbd' }, 'select'), ' · shift-drag ', h('span', { class: 'kbd' }, 'pan'), ' · ', h('span', { class: 'kbd' }, 'W A S D'), ' · click ', h('span', { class: 'kbd' }, 'pin')));
  const legend = h('div', { class: 'legend' });
  const canvas = h('canvas', { class: 'interactive', tabindex: '0', 'aria-label': 'active memory timeline' });
  const overview = h('canvas', { style: 'cursor:grab', 'aria-label': 'overview of the whole window' });
  const plotBox = h('div', { class: 'plot' }, h('div', { class: 'canvas-wrap' }, canvas), h('div', { class: 'canvas-wrap', style: 'margin-top:6px' }, overview));
  const readout = h('div', { class: 'readout' });
  const detail = h('div');
  const panel = h('aside', { class: 'detail-panel', 'aria-live': 'polite' }, readout, detail);
  tl.body.classList.add('flush');
  tl.body.append(toolbar, h('div', { class: 'legend-row' }, legend), h('div', { class: 'timeline-grid' }, plotBox, panel));
  if (nBands === 0 && !hasOther && reserved.t.length === 0) {
    plotBox.prepend(h('div', { class: 'empty' }, 'no allocations recorded in this window'));
  }

  const PAD = { l: 66, r: 14, t: 22, b: 26 };
  const HEIGHT = 440, OV_HEIGHT = 54;
  let W = 800, ctx = null, octx = null;
  function layout() {
    W = Math.max(320, plotBox.clientWidth - 16);
    ctx = M.setupCanvas(canvas, W, HEIGHT);
    octx = M.setupCanvas(overview, W, OV_HEIGHT);
  }
  const plotW = () => W - PAD.l - PAD.r;
  const plotH = HEIGHT - PAD.t - PAD.b;
  const X = (t) => PAD.l + ((t - view.t0) / (view.t1 - view.t0)) * plotW();
  const T = (x) => view.t0 + ((x - PAD.l) / plotW()) * (view.t1 - view.t0);
  let yMax = 1;
  const Y = (v) => PAD.t + plotH - (v / yMax) * plotH;
  const V = (y) => ((PAD.t + plotH - y) / plotH) * yMax;

  function computeYMax() {
    let m;
    if (fitY) {
      m = Math.max(maxIn(otherBand.t, otherBand.top, view.t0, view.t1), maxIn(reserved.t, reserved.v, view.t0, view.t1),
        maxIn(allocatedTotal.t, allocatedTotal.v, view.t0, view.t1));
    } else {
      if (!yMaxFixed) {
        yMaxFixed = Math.max(maxIn(otherBand.t, otherBand.top, -Infinity, Infinity), maxIn(reserved.t, reserved.v, -Infinity, Infinity),
          maxIn(allocatedTotal.t, allocatedTotal.v, -Infinity, Infinity), num(statsIn.peak_reserved, 0));
      }
      m = yMaxFixed;
    }
    yMax = m > 0 ? m * 1.06 : 1024;
  }

  const findingShades = [M.mix('#d92d20', '#ffffff', 0.05), M.mix('#d92d20', '#000000', 0.18)];
  function bandColor(b) {
    if (colorBy === 'stack') {
      const s = bStack[b];
      return s < 0 ? greyShades[b & 3] : M.shades(M.STACK_PALETTE[M.stackColorIndex(s)])[b & 1];
    }
    const c = bCat[b];
    return (c >= 0 && c < catShades.length ? catShades[c] : greyShades)[b & 3];
  }
  const stackShadeCache = new Map();
  function colorFor(b) {
    if (colorBy !== 'stack') return bandColor(b);
    const key = bStack[b] < 0 ? -1 - (b & 3) : M.stackColorIndex(bStack[b]) * 2 + (b & 1);
    let c = stackShadeCache.get(key);
    if (!c) { c = bandColor(b); stackShadeCache.set(key, c); }
    return c;
  }
  function matches(b) {
    if (!highlight) return true;
    if (highlight.kind === 'set') return highlight.mask[b] === 1;
    return highlight.kind === 'stack' ? bStack[b] === highlight.id : bCat[b] === highlight.id;
  }

  // Appends band b's outline (bottom edge forward, top edge back) to path.
  const scratchX = [], scratchY = [];
  // Subpaths are left open for fills (fill closes them): Chromium's Path2D.closePath() costs time
  // that grows with the path, ruinous for 20000 subpaths; only outlines are closed.
  function bandPath(path, b, close) {
    const s = vStart[b], e = vStart[b + 1];
    if (s === e) return false;
    const endT = bEndDraw(b);
    const left = PAD.l - 2, right = W - PAD.r + 2;
    let i = Math.max(s, lastLE(vT, view.t0, s, e));
    const hpx = (bSize[b] / yMax) * plotH;
    let n = 0;
    let x = Math.max(left, X(Math.max(bStart[b], vT[i])));
    let y = Y(vO[i]);
    scratchX[n] = x; scratchY[n] = y; n++;
    let lastX = x;
    for (i++; i < e && vT[i] <= view.t1; i++) {
      const yi = Y(vO[i]);
      // Level of detail: a shift of under half a pixel is not drawn until shifts add up.
      if (Math.abs(yi - y) < 0.5) continue;
      const xi = Math.max(left, X(vT[i]));
      if (xi - lastX < 0.5) { scratchY[n - 1] = yi; }
      else { scratchX[n] = xi; scratchY[n] = y; n++; scratchX[n] = xi; scratchY[n] = yi; n++; lastX = xi; }
      y = yi;
    }
    const xe = Math.min(right, X(endT));
    if (xe < x) return false;
    scratchX[n] = Math.max(xe, lastX + 0.6); scratchY[n] = y; n++;
    path.moveTo(scratchX[0], scratchY[0]);
    for (let k = 1; k < n; k++) path.lineTo(scratchX[k], scratchY[k]);
    for (let k = n - 1; k >= 0; k--) path.lineTo(scratchX[k], scratchY[k] - hpx);
    if (close) path.closePath();
    return true;
  }

  let hatch = null;
  function hatchPattern(c) {
    if (hatch) return hatch;
    const p = document.createElement('canvas');
    p.width = p.height = 8;
    const g = p.getContext('2d');
    g.strokeStyle = M.cssVar('--other-band');
    g.lineWidth = 1.5;
    g.beginPath(); g.moveTo(-2, 10); g.lineTo(10, -2); g.moveTo(6, 10); g.lineTo(10, 6); g.moveTo(-2, 2); g.lineTo(2, -2); g.stroke();
    hatch = c.createPattern(p, 'repeat');
    return hatch;
  }

  function stepPath(c, ts, vs, close, base) {
    if (!ts.length) return false;
    let i = Math.max(0, lastLE(ts, view.t0));
    const left = PAD.l, right = W - PAD.r;
    let x = Math.max(left, X(ts[i]));
    let y = Y(vs[i]);
    c.moveTo(x, close ? Y(base ? base[i] : 0) : y);
    if (close) c.lineTo(x, y);
    let lastX = x;
    for (i++; i < ts.length && ts[i] <= view.t1; i++) {
      const xi = X(ts[i]);
      const yi = Y(vs[i]);
      if (xi - lastX < 0.35) { y = Math.min(y, yi); c.lineTo(xi, y); y = yi; continue; }
      c.lineTo(xi, y); c.lineTo(xi, yi); y = yi; lastX = xi;
    }
    c.lineTo(right, y);
    return true;
  }

  function timeTickLabel(v, step) {
    const units = [[1e9, 's'], [1e6, 'ms'], [1e3, 'µs'], [1, 'ns']];
    const [u, name] = units.find(([u]) => step >= u) || [1, 'ns'];
    const dec = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / u) + 1e-9)));
    return (v / u).toFixed(dec) + ' ' + name;
  }

  let lastDrawMs = 0;
  let drawn = 0;
  function draw() {
    const t0 = performance.now();
    const c = ctx;
    computeYMax();
    c.clearRect(0, 0, W, HEIGHT);
    const fg = M.cssVar('--fg'), muted = M.cssVar('--muted'), grid = M.cssVar('--grid'), line = M.cssVar('--line');
    c.font = '11px ' + M.cssVar('--sans');
    // grid + y axis
    const yt = M.byteTicks(yMax, 6);
    c.strokeStyle = grid; c.lineWidth = 1; c.fillStyle = muted; c.textAlign = 'right'; c.textBaseline = 'middle';
    for (const v of yt.ticks) {
      const y = Math.round(Y(v)) + 0.5;
      c.beginPath(); c.moveTo(PAD.l, y); c.lineTo(W - PAD.r, y); c.stroke();
      c.fillText(fmtBytes(v), PAD.l - 8, y);
    }
    const xt = M.timeTicks(view.t0, view.t1, Math.max(2, Math.floor(plotW() / 110)));
    c.textAlign = 'center'; c.textBaseline = 'top';
    for (const v of xt.ticks) {
      const x = Math.round(X(v)) + 0.5;
      c.beginPath(); c.moveTo(x, PAD.t); c.lineTo(x, PAD.t + plotH); c.stroke();
      c.fillText(timeTickLabel(v, xt.step), x, PAD.t + plotH + 7);
    }
    c.save();
    c.beginPath(); c.rect(PAD.l, PAD.t - 1, plotW(), plotH + 1); c.clip();

    // bands, grouped by colour so a frame issues a few dozen fills, not 20000
    const groups = new Map(), dim = new Path2D();
    let visible = 0;
    for (let b = 0; b < nBands; b++) {
      if (bStart[b] > view.t1) break; // sorted by start
      if (bEndDraw(b) < view.t0) continue;
      // A finding's allocations stand out in one strong colour, whatever their category.
      const col = highlight && highlight.kind === 'set' && highlight.mask[b] === 1 ? findingShades[b & 1] : colorFor(b);
      let p;
      if (matches(b)) { p = groups.get(col); if (!p) { p = new Path2D(); groups.set(col, p); } }
      else p = dim;
      if (bandPath(p, b)) visible++;
    }
    const tPaths = performance.now();
    if (highlight) { c.globalAlpha = 0.16; c.fillStyle = M.cssVar('--muted'); c.fill(dim); c.globalAlpha = 1; }
    for (const [col, p] of groups) { c.fillStyle = col; c.fill(p); }
    canvas.dataset.pathMs = (tPaths - t0).toFixed(1);

    // the summary band of everything not drawn one by one
    if (hasOther) {
      const p = new Path2D();
      const ob = otherBand;
      let i = Math.max(0, lastLE(ob.t, view.t0));
      const pts = [];
      let lastX = -Infinity;
      for (; i < ob.t.length; i++) {
        const x = Math.max(PAD.l - 2, X(ob.t[i]));
        if (x > W) break;
        if (x - lastX < 0.5 && pts.length) { const q = pts[pts.length - 1]; q[1] = Math.min(q[1], ob.bot[i]); q[2] = Math.max(q[2], ob.top[i]); continue; }
        pts.push([x, ob.bot[i], ob.top[i]]);
        lastX = x;
      }
      if (pts.length) {
        pts.push([W - PAD.r + 2, pts[pts.length - 1][1], pts[pts.length - 1][2]]);
        p.moveTo(pts[0][0], Y(pts[0][1]));
        for (let k = 1; k < pts.length; k++) { p.lineTo(pts[k][0], Y(pts[k - 1][1])); p.lineTo(pts[k][0], Y(pts[k][1])); }
        for (let k = pts.length - 1; k >= 1; k--) { p.lineTo(pts[k][0], Y(pts[k][2])); p.lineTo(pts[k][0], Y(pts[k - 1][2])); }
        p.lineTo(pts[0][0], Y(pts[0][2]));
        p.closePath();
        c.globalAlpha = highlight ? 0.35 : 0.55;
        c.fillStyle = M.mix('#9aa1ad', '#ffffff', 0.55);
        c.fill(p);
        c.globalAlpha = highlight ? 0.4 : 1;
        c.fillStyle = hatchPattern(c);
        c.fill(p);
        c.globalAlpha = 1;
      }
    }

    // hovered / pinned band
    for (const sel of [pinned, hover]) {
      if (!sel || sel.type !== 'band') continue;
      const p = new Path2D();
      if (!bandPath(p, sel.b, true)) continue;
      c.fillStyle = 'rgba(255,255,255,0.35)';
      c.fill(p);
      c.strokeStyle = fg; c.lineWidth = sel === pinned ? 2 : 1.25;
      c.stroke(p);
    }

    // reserved memory, and the total allocated when given separately (it covers the LOD'd rest)
    if (reserved.t.length) {
      c.beginPath();
      stepPath(c, reserved.t, reserved.v);
      c.strokeStyle = M.cssVar('--reserved'); c.lineWidth = 1.5; c.setLineDash([5, 3]);
      c.stroke(); c.setLineDash([]);
    }
    if (allocatedTotal.t.length && !hasOther && nBands === 0) {
      c.beginPath();
      stepPath(c, allocatedTotal.t, allocatedTotal.v);
      c.strokeStyle = M.cssVar('--accent'); c.lineWidth = 1.25; c.stroke();
    }
    c.restore();

    // the batch a finding names: its span shaded and labelled
    if (marked) {
      const a = Math.max(view.t0, marked.t0), z = Math.min(view.t1, marked.t1);
      if (z > a) {
        const x0 = X(a), x1 = X(z);
        c.save();
        c.fillStyle = M.cssVar('--accent'); c.globalAlpha = 0.08;
        c.fillRect(x0, PAD.t, x1 - x0, plotH);
        c.globalAlpha = 1; c.strokeStyle = M.cssVar('--accent'); c.lineWidth = 1.5;
        c.strokeRect(Math.round(x0) + 0.5, PAD.t + 0.5, Math.max(1, x1 - x0 - 1), plotH - 1);
        c.fillStyle = M.cssVar('--accent'); c.font = '700 11px ' + M.cssVar('--sans'); c.textAlign = 'left'; c.textBaseline = 'top';
        c.fillText(marked.label, x0 + 5, PAD.t + 5);
        c.restore();
      }
    }
    // batch boundaries
    c.textAlign = 'left'; c.textBaseline = 'alphabetic';
    let lastLabelX = -Infinity;
    for (const bt of batches) {
      if (bt.t < view.t0 || bt.t > view.t1) continue;
      const x = Math.round(X(bt.t)) + 0.5;
      c.strokeStyle = M.cssVar('--faint'); c.lineWidth = 1; c.setLineDash([3, 3]);
      c.beginPath(); c.moveTo(x, PAD.t - 4); c.lineTo(x, PAD.t + plotH); c.stroke(); c.setLineDash([]);
      if (x - lastLabelX > 58) {
        c.fillStyle = muted; c.font = '600 11px ' + M.cssVar('--sans');
        c.fillText('batch ' + str(bt.batch, '?'), x + 4, PAD.t - 8);
        lastLabelX = x;
      }
    }
    c.font = '11px ' + M.cssVar('--sans');
    // peak marker
    if (isFinite(peakT) && isFinite(peakV) && peakT >= view.t0 && peakT <= view.t1 && peakV <= yMax) {
      const x = X(peakT), y = Y(peakV);
      c.fillStyle = fg; c.beginPath(); c.arc(x, y, 3.5, 0, 2 * Math.PI); c.fill();
      c.textAlign = x > W - 140 ? 'right' : 'left';
      c.fillStyle = fg; c.font = '600 11px ' + M.cssVar('--sans');
      c.fillText('peak ' + fmtBytes(peakV), x + (c.textAlign === 'left' ? 7 : -7), Math.max(PAD.t + 10, y - 6));
      c.font = '11px ' + M.cssVar('--sans');
    }
    // OOMs
    const bad = M.cssVar('--bad');
    ooms.forEach((o) => {
      if (o.t < view.t0 || o.t > view.t1) return;
      const x = Math.round(X(o.t)) + 0.5;
      c.strokeStyle = bad; c.lineWidth = 2;
      c.beginPath(); c.moveTo(x, PAD.t); c.lineTo(x, PAD.t + plotH); c.stroke();
      c.fillStyle = bad;
      c.beginPath(); c.moveTo(x - 7, PAD.t - 12); c.lineTo(x + 7, PAD.t - 12); c.lineTo(x, PAD.t - 1); c.closePath(); c.fill();
      c.font = '700 11px ' + M.cssVar('--sans'); c.textAlign = 'right';
      c.fillText('OOM', x - 9, PAD.t - 3);
      c.font = '11px ' + M.cssVar('--sans');
    });
    // frame
    c.strokeStyle = line; c.lineWidth = 1;
    c.strokeRect(PAD.l + 0.5, PAD.t + 0.5, plotW() - 1, plotH - 1);
    // crosshair
    if (hoverPos && !drag) {
      c.strokeStyle = fg; c.globalAlpha = 0.35; c.lineWidth = 1;
      const x = Math.round(hoverPos.x) + 0.5;
      c.beginPath(); c.moveTo(x, PAD.t); c.lineTo(x, PAD.t + plotH); c.stroke();
      c.globalAlpha = 1;
    }
    if (drag && drag.mode === 'select') {
      const a = Math.min(drag.x0, drag.x1), b = Math.max(drag.x0, drag.x1);
      c.fillStyle = 'rgba(79,70,229,0.12)'; c.fillRect(a, PAD.t, b - a, plotH);
      c.strokeStyle = M.cssVar('--accent'); c.lineWidth = 1; c.strokeRect(a + 0.5, PAD.t + 0.5, b - a, plotH - 1);
      c.fillStyle = fg; c.textAlign = 'center';
      c.fillText(fmtDur(Math.abs(T(drag.x1) - T(drag.x0))), (a + b) / 2, PAD.t + 12);
    }
    if (nBands === 0 && !hasOther) {
      c.fillStyle = muted; c.textAlign = 'center'; c.font = '13px ' + M.cssVar('--sans');
      c.fillText('no allocations recorded in this window', PAD.l + plotW() / 2, PAD.t + plotH / 2);
    }
    drawOverview();
    rangeLabel.textContent = fmtRel(view.t0) + ' … ' + fmtRel(view.t1) + '  (' + fmtDur(view.t1 - view.t0) + ')';
    lastDrawMs = performance.now() - t0;
    drawn++;
    canvas.dataset.visibleBands = String(visible);
    canvas.dataset.drawMs = lastDrawMs.toFixed(1);
  }

  function drawOverview() {
    const c = octx;
    c.clearRect(0, 0, W, OV_HEIGHT);
    const OX = (t) => PAD.l + ((t - tMin) / (tMax - tMin)) * plotW();
    const src = allocatedTotal.t.length ? allocatedTotal : { t: otherBand.t, v: otherBand.top };
    const m = Math.max(maxIn(src.t, src.v, -Infinity, Infinity), maxIn(reserved.t, reserved.v, -Infinity, Infinity), 1) * 1.08;
    const OY = (v) => OV_HEIGHT - 2 - (v / m) * (OV_HEIGHT - 6);
    c.fillStyle = M.cssVar('--panel-2'); c.fillRect(PAD.l, 0, plotW(), OV_HEIGHT);
    const series = (s, fill) => {
      if (!s.t.length) return;
      c.beginPath();
      let lastX = -Infinity, y = OY(s.v[0]);
      c.moveTo(Math.max(PAD.l, OX(s.t[0])), fill ? OY(0) : y);
      c.lineTo(Math.max(PAD.l, OX(s.t[0])), y);
      for (let i = 1; i < s.t.length; i++) {
        const x = OX(s.t[i]);
        const yi = OY(s.v[i]);
        if (x - lastX < 0.5) { y = Math.min(y, yi); c.lineTo(x, y); y = yi; continue; }
        c.lineTo(x, y); c.lineTo(x, yi); y = yi; lastX = x;
      }
      c.lineTo(W - PAD.r, y);
      if (fill) { c.lineTo(W - PAD.r, OY(0)); c.closePath(); c.fillStyle = M.mix('#4e79a7', '#ffffff', 0.45); c.fill(); }
      else { c.strokeStyle = M.cssVar('--reserved'); c.lineWidth = 1; c.setLineDash([3, 2]); c.stroke(); c.setLineDash([]); }
    };
    series(src, true);
    series(reserved, false);
    c.strokeStyle = M.cssVar('--faint'); c.lineWidth = 1;
    for (const bt of batches) { const x = Math.round(OX(bt.t)) + 0.5; c.beginPath(); c.moveTo(x, 0); c.lineTo(x, OV_HEIGHT); c.stroke(); }
    c.fillStyle = M.cssVar('--bad');
    for (const o of ooms) c.fillRect(OX(o.t) - 1, 0, 2, OV_HEIGHT);
    // the brush: what the main plot shows
    const a = OX(view.t0), b = OX(view.t1);
    c.fillStyle = 'rgba(100,110,130,0.22)';
    c.fillRect(PAD.l, 0, a - PAD.l, OV_HEIGHT);
    c.fillRect(b, 0, W - PAD.r - b, OV_HEIGHT);
    c.strokeStyle = M.cssVar('--accent'); c.lineWidth = 1.5;
    c.strokeRect(a + 0.5, 0.75, Math.max(2, b - a - 1), OV_HEIGHT - 1.5);
    c.fillStyle = M.cssVar('--muted'); c.font = '10.5px ' + M.cssVar('--sans'); c.textAlign = 'right'; c.textBaseline = 'middle';
    c.fillText('overview', PAD.l - 8, OV_HEIGHT / 2);
  }

  let frameReq = 0;
  function schedule() {
    if (frameReq) return;
    frameReq = requestAnimationFrame(() => { frameReq = 0; draw(); });
  }

  // ---- view changes --------------------------------------------------------------------------
  const MIN_SPAN = 200;
  function setView(t0, t1) {
    let span = Math.max(MIN_SPAN, Math.min(tMax - tMin, t1 - t0));
    if (!(span > 0)) span = tMax - tMin;
    let a = t0;
    if (a < tMin) a = tMin;
    if (a + span > tMax) a = tMax - span;
    view.t0 = a; view.t1 = a + span;
    schedule();
    rememberView();
  }
  function zoomAt(t, factor) { setView(t - (t - view.t0) * factor, t + (view.t1 - t) * factor); }
  function pan(fraction) { const s = view.t1 - view.t0; setView(view.t0 + s * fraction, view.t1 + s * fraction); }
  function resetView() { setView(tMin, tMax); }

  function setColorBy(mode) {
    colorBy = mode;
    btnCat.classList.toggle('on', mode === 'category');
    btnStack.classList.toggle('on', mode === 'stack');
    buildLegend();
    schedule();
  }
  function setHighlight(hl) {
    highlight = hl && highlight && hl.kind === highlight.kind && hl.id === highlight.id ? null : hl;
    buildLegend();
    if (sitesTable()) sitesTable().refresh();
    schedule();
  }

  // A finding shown (rank_findings.js): its allocations highlighted, its batch marked.
  function showFinding(hl, mark, count, scroll) {
    highlight = hl;
    marked = mark;
    canvas.dataset.highlighted = String(count);
    canvas.dataset.markedBatch = marked ? String(marked.batch) : '';
    buildLegend();
    if (sitesTable()) sitesTable().refresh();
    schedule();
    if (scroll) tl.el.scrollIntoView({ behavior: 'auto', block: 'start' });
  }

  function buildLegend() {
    M.clear(legend);
    if (colorBy === 'category') {
      const counts = new Map();
      for (let b = 0; b < nBands; b++) counts.set(bCat[b], (counts.get(bCat[b]) || 0) + 1);
      const ids = categories.map((_, i) => i).filter((i) => counts.has(i));
      if (counts.has(-1)) ids.push(-1);
      for (const i of ids) {
        const on = !highlight || (highlight.kind === 'category' && highlight.id === i);
        legend.append(h('span', { class: 'item clickable' + (on ? '' : ' dim'), title: 'click to highlight this category', onclick: () => setHighlight({ kind: 'category', id: i }) },
          h('span', { class: 'sw', style: 'background:' + catColor(i) }), catName(i), h('b', null, fmtInt(counts.get(i)))));
      }
    } else {
      legend.append(h('span', { class: 'item' }, ...M.STACK_PALETTE.slice(0, 6).map((c) => h('span', { class: 'sw', style: 'background:' + c + ';margin-right:-4px' })), h('span', { style: 'margin-left:6px' }, 'one colour per allocation stack')));
    }
    if (hasOther) {
      const cnt = otherCount.v.length ? Math.max(...otherCount.v) : 0;
      legend.append(h('span', { class: 'item', title: 'allocations too small to draw one by one, summed' }, h('span', { class: 'sw hatch' }), 'small allocations, summed' + (cnt ? ' (up to ' + fmtInt(cnt) + ' live)' : '')));
    }
    if (reserved.t.length) legend.append(h('span', { class: 'item' }, h('span', { class: 'sw line' }), 'reserved'));
    if (batches.length) {
      legend.append(h('span', { class: 'item', title: bmInferred ? str(bm.detail, '') : 'marked by the source', dataset: { batchMethod: bmMethod } },
        h('span', { class: 'sw vline' }), bmInferred ? 'batch start (inferred: ' + bmMethod + ', ' + fmtPct(num(bm.confidence, 0)) + ')' : 'batch start'));
    }
    if (ooms.length) legend.append(h('span', { class: 'item' }, h('span', { class: 'sw oom' }), 'out of memory'));
    if (highlight && highlight.kind === 'set') legend.append(h('span', { class: 'item' }, h('b', null, 'highlighted: the ' + (M.KIND_LABEL[highlight.label] || highlight.label) + '\u2019s allocations')));
    if (highlight) legend.append(h('button', { onclick: () => setHighlight(null) }, 'Clear highlight'));
  }

  // ---- hit testing ---------------------------------------------------------------------------
  function hitTest(x, y) {
    if (x < PAD.l || x > W - PAD.r || y < PAD.t - 14 || y > PAD.t + plotH) return null;
    const t = T(x);
    for (let i = 0; i < ooms.length; i++) if (Math.abs(X(ooms[i].t) - x) <= 4) return { type: 'oom', i, t };
    if (y < PAD.t) return null;
    const v = V(y);
    // bands live at t: sorted by start, so only those starting before t can hold it
    const ub = lastLE(bStart, t);
    for (let b = 0; b <= ub; b++) {
      if (bEndDraw(b) <= t) continue;
      const off = bandOffsetAt(b, t);
      if (v >= off && v < off + bSize[b]) return { type: 'band', b, t };
    }
    if (hasOther) {
      const i = lastLE(otherBand.t, t);
      if (i >= 0 && v >= otherBand.bot[i] && v < otherBand.top[i]) return { type: 'other', t };
    }
    return { type: 'none', t };
  }

  function bandFacts(b) {
    const i = bSrc[b];
    const live = bEnd[b] === Infinity;
    const before = bStart[b] < 0;
    return [
      ['size', fmtBytes(bSize[b]) + '  (' + fmtExactBytes(bSize[b]) + ')'],
      ['address', fmtHex(arr(A.addr)[i])],
      ['category', catName(bCat[b])],
      ['stream', str(arr(A.stream)[i], '–')],
      ['device', str(arr(A.device)[i], '–')],
      ['allocated', before ? fmtRel(bStart[b]) + ' (before the window)' : fmtRel(bStart[b])],
      ['freed', live ? 'still live at window end' : fmtRel(bEnd[b])],
      ['lifetime', live ? '≥ ' + fmtDur(tMax - bStart[b]) : fmtDur(bEnd[b] - bStart[b])],
    ];
  }
  function tipFor(hit) {
    if (hit.type === 'band') {
      const b = hit.b;
      const top = topFrameText(bStack[b]);
      return M.tipBody(fmtBytes(bSize[b]) + ' · ' + catName(bCat[b]), bandFacts(b).slice(1),
        [top ? h('div', { class: 'fr' }, top) : h('div', { class: 'fr' }, 'no stack recorded'), h('div', { class: 'foot' }, pinned && pinned.type === 'band' && pinned.b === b ? 'pinned · click to unpin' : 'click to pin the details')]);
    }
    if (hit.type === 'other') {
      const bytes = stepAt(other.t, other.v, hit.t), count = stepAt(otherCount.t, otherCount.v, hit.t);
      return M.tipBody('other allocations · ' + fmtBytes(bytes), [['count', fmtInt(count)], ['at', fmtRel(hit.t)]],
        h('div', { class: 'foot' }, 'smaller allocations, summed into one band'));
    }
    if (hit.type === 'oom') {
      const o = ooms[hit.i];
      return M.tipBody('Out of memory', [['requested', fmtBytes(num(o.size))], ['device free', fmtBytes(num(o.device_free))], ['device', str(o.device, '–')], ['at', fmtRel(o.t)]]);
    }
    return null;
  }

  function updateReadout(t) {
    M.clear(readout);
    if (t == null) {
      readout.append(h('div', { class: 'hint' }, 'Move over the timeline to read memory at a time.'));
      return;
    }
    const pairs = [['time', fmtRel(t)]];
    if (allocatedTotal.t.length) pairs.push(['allocated', fmtBytes(stepAt(allocatedTotal.t, allocatedTotal.v, t))]);
    else pairs.push(['allocated', fmtBytes(stepAt(otherBand.t, otherBand.top, t))]);
    if (reserved.t.length) pairs.push(['reserved', fmtBytes(stepAt(reserved.t, reserved.v, t))]);
    if (hasOther) pairs.push(['other', fmtBytes(stepAt(other.t, other.v, t)) + ' in ' + fmtInt(stepAt(otherCount.t, otherCount.v, t)) + ' allocs']);
    let live = 0;
    const ub = lastLE(bStart, t);
    for (let b = 0; b <= ub; b++) if (bEndDraw(b) > t) live++;
    pairs.push(['bands live', fmtInt(live)]);
    const bi = lastLE(Float64Array.from(batches.map((x) => x.t)), t);
    if (bi >= 0) pairs.push(['batch', str(batches[bi].batch)]);
    readout.append(M.kvList(pairs));
  }
  function updateDetail() {
    const sel = pinned || hover;
    M.clear(detail);
    if (!sel || sel.type === 'none') {
      detail.append(h('h3', null, 'Details'), h('div', { class: 'hint' }, 'Hover a band to see the allocation, its address and stack. Click to pin it here; Esc unpins.'));
      detail.dataset.kind = 'none';
      return;
    }
    detail.dataset.kind = sel.type;
    const title = h('h3');
    if (pinned) title.append(h('span', { class: 'badge accent' }, 'pinned'));
    if (sel.type === 'band') {
      const b = sel.b;
      title.append(h('span', null, 'Allocation of ' + fmtBytes(bSize[b])));
      if (pinned) title.append(h('button', { class: 'icon', title: 'unpin (Esc)', onclick: () => { pinned = null; updateDetail(); schedule(); } }, '×'));
      detail.append(title, M.kvList(bandFacts(b)), h('div', { style: 'margin-top:10px;font-weight:600;font-size:12.5px' }, 'Stack (innermost first)'), M.stackList(stackFrames(bStack[b])));
      if (bStack[b] >= 0) {
        const on = highlight && highlight.kind === 'stack' && highlight.id === bStack[b];
        detail.append(h('div', { style: 'margin-top:10px' }, h('button', { onclick: () => setHighlight({ kind: 'stack', id: bStack[b] }) }, on ? 'Clear highlight' : 'Highlight this stack')));
      }
      detail.dataset.size = String(bSize[b]);
    } else {
      const body = tipFor(sel);
      title.append(h('span', null, sel.type === 'oom' ? 'Out of memory' : 'Other allocations'));
      detail.append(title, body ? body[1] : null);
    }
  }

  // ---- interaction ---------------------------------------------------------------------------
  canvas.addEventListener('mousemove', (ev) => {
    const p = local(ev, canvas);
    if (drag) {
      if (drag.mode === 'select') drag.x1 = Math.max(PAD.l, Math.min(W - PAD.r, p.x));
      else { const dt = ((drag.x0 - p.x) / plotW()) * (drag.v1 - drag.v0); setView(drag.v0 + dt, drag.v1 + dt); }
      schedule();
      return;
    }
    const hit = hitTest(p.x, p.y);
    hoverPos = p.x >= PAD.l && p.x <= W - PAD.r ? { x: p.x, y: p.y, t: T(p.x) } : null;
    const changed = JSON.stringify(hit) !== JSON.stringify(hover);
    hover = hit && hit.type !== 'none' ? hit : null;
    updateReadout(hoverPos ? hoverPos.t : null);
    if (changed) updateDetail();
    const content = hover ? tipFor(hover) : null;
    if (content) M.tip(ev.clientX, ev.clientY, content); else M.hideTip();
    schedule();
  });
  canvas.addEventListener('mouseleave', () => { hover = null; hoverPos = null; M.hideTip(); updateDetail(); updateReadout(null); schedule(); });
  canvas.addEventListener('mousedown', (ev) => {
    const p = local(ev, canvas);
    canvas.focus({ preventScroll: true });
    if (ev.button === 1 || ev.shiftKey || ev.altKey) { drag = { mode: 'pan', x0: p.x, v0: view.t0, v1: view.t1 }; canvas.style.cursor = 'grabbing'; }
    else if (ev.button === 0) drag = { mode: 'select', x0: p.x, x1: p.x };
    ev.preventDefault();
  });
  window.addEventListener('mouseup', (ev) => {
    if (!drag) return;
    const d = drag;
    drag = null;
    canvas.style.cursor = '';
    if (d.mode === 'select') {
      if (Math.abs(d.x1 - d.x0) > 4) setView(T(Math.min(d.x0, d.x1)), T(Math.max(d.x0, d.x1)));
      else if (ev.target === canvas) {
        const p = local(ev, canvas);
        const hit = hitTest(p.x, p.y);
        if (hit && hit.type !== 'none') pinned = pinned && JSON.stringify(pinned.b) === JSON.stringify(hit.b) && pinned.type === hit.type ? null : hit;
        else pinned = null;
        updateDetail();
        const content = hit && hit.type !== 'none' ? tipFor(hit) : null;
        if (content) M.tip(ev.clientX, ev.clientY, content);
      }
    }
    schedule();
  });
  canvas.addEventListener('dblclick', () => resetView());
  canvas.addEventListener('wheel', (ev) => {
    ev.preventDefault();
    const p = local(ev, canvas);
    const dx = ev.deltaMode === 1 ? ev.deltaX * 16 : ev.deltaX, dy = ev.deltaMode === 1 ? ev.deltaY * 16 : ev.deltaY;
    if (Math.abs(dx) > Math.abs(dy) || ev.shiftKey) pan((ev.shiftKey ? dy || dx : dx) / plotW());
    else zoomAt(T(Math.max(PAD.l, Math.min(W - PAD.r, p.x))), Math.exp(Math.max(-1, Math.min(1, dy * 0.002))));
  }, { passive: false });
  document.addEventListener('keydown', (ev) => {
    if (ev.target && /^(INPUT|TEXTAREA|SELECT)$/.test(ev.target.tagName)) return;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const k = ev.key.toLowerCase();
    const mid = hoverPos ? hoverPos.t : (view.t0 + view.t1) / 2;
    if (k === 'w' || k === '+' || k === '=') zoomAt(mid, 0.6);
    else if (k === 's' || k === '-') zoomAt(mid, 1 / 0.6);
    else if (k === 'a' || k === 'arrowleft') pan(-0.2);
    else if (k === 'd' || k === 'arrowright') pan(0.2);
    else if (k === '0') resetView();
    else if (k === 'escape') { pinned = null; setHighlight(null); updateDetail(); }
    else return;
    if (document.activeElement === canvas || k !== 'a' || true) ev.preventDefault();
  });
  // overview: drag the brush, or click to centre there
  let ovDrag = null;
  const OT = (x) => tMin + ((x - PAD.l) / plotW()) * (tMax - tMin);
  overview.addEventListener('mousedown', (ev) => {
    const p = local(ev, overview);
    const t = OT(p.x);
    if (t < view.t0 || t > view.t1) { const s = view.t1 - view.t0; setView(t - s / 2, t + s / 2); }
    ovDrag = { x0: p.x, v0: view.t0, v1: view.t1 };
    ev.preventDefault();
  });
  window.addEventListener('mousemove', (ev) => {
    if (!ovDrag) return;
    const p = local(ev, overview);
    const dt = ((p.x - ovDrag.x0) / plotW()) * (tMax - tMin);
    setView(ovDrag.v0 + dt, ovDrag.v1 + dt);
  });
  window.addEventListener('mouseup', () => { ovDrag = null; });
  // Deep links: #view=T0,T1 (ns since the window opened) opens the page zoomed there.
  const hashView = /(?:^|[#&])view=(-?[\d.]+),(-?[\d.]+)/.exec(location.hash);
  if (hashView && Number(hashView[2]) > Number(hashView[1])) { view.t0 = Math.max(tMin, Number(hashView[1])); view.t1 = Math.min(tMax, Number(hashView[2])); }
  let hashTimer = 0;
  function rememberView() {
    clearTimeout(hashTimer);
    hashTimer = setTimeout(() => {
      const rest = location.hash.slice(1).split('&').filter((x) => x && !x.startsWith('view='));
      if (view.t0 > tMin || view.t1 < tMax) rest.push('view=' + Math.round(view.t0) + ',' + Math.round(view.t1));
      try { history.replaceState(null, '', rest.length ? '#' + rest.join('&') : location.pathname + location.search); } catch (e) { /* file:// in some browsers */ }
    }, 300);
  }

  function build(main) {
    main.append(tl.el);
  }
  // The first draw, and a redraw when the width changes.
  function start() {
    buildLegend();
    updateReadout(null);
    updateDetail();
    layout();
    draw();
    M.onWidthChange(plotBox, () => { layout(); draw(); });
    canvas.dataset.bands = String(nBands);
    canvas.dataset.vertices = String(vT.length);
    canvas.dataset.quantum = String(geometry.quantum);
    document.body.dataset.geometryMs = geometry.ms.toFixed(1);
  }

  // Self test (#selftest, rank.js): hover and pin the largest band, zoom and reset.
  function selfTest(check, fire) {
    const rect = canvas.getBoundingClientRect();
    let big = -1;
    for (let b = 0; b < nBands; b++) if (big < 0 || bSize[b] > bSize[big]) big = b;
    if (big >= 0) {
      const a = Math.max(bStart[big], tMin), z = Math.min(bEndDraw(big), tMax);
      const t = (a + z) / 2;
      const off = bandOffsetAt(big, t);
      const cx = rect.left + X(t), cy = rect.top + Y(off + bSize[big] / 2);
      check('hover', () => { fire(canvas, 'mousemove', cx, cy); return detail.dataset.kind === 'band' && detail.textContent.includes(fmtBytes(bSize[big])); });
      check('pin', () => { fire(canvas, 'mousedown', cx, cy); fire(canvas, 'mouseup', cx, cy); fire(canvas, 'mousemove', rect.left + PAD.l + 1, rect.top + PAD.t + 1); return pinned && pinned.b === big && detail.textContent.includes('pinned'); });
    }
    const span0 = view.t1 - view.t0;
    if (nBands === 0 && !hasOther) check('empty', () => tl.el.textContent.includes('no allocations recorded'));
    if (span0 > 4 * MIN_SPAN) check('zoom', () => { canvas.dispatchEvent(new WheelEvent('wheel', { bubbles: true, cancelable: true, clientX: rect.left + PAD.l + plotW() / 2, clientY: rect.top + 100, deltaY: -300 })); return view.t1 - view.t0 < span0 * 0.9; });
    if (span0 > 4 * MIN_SPAN) check('reset', () => { btnReset.click(); return Math.abs(view.t1 - view.t0 - span0) < 1; });
    draw();
  }
  // The stacked bands plus the summary band must add up to the recorded total allocated.
  function totalsTest(check) {
    if (allocatedTotal.t.length && otherBand.t.length) {
      check('totals', () => {
        let worst = 0;
        for (let k = 0; k < allocatedTotal.t.length; k += Math.max(1, Math.floor(allocatedTotal.t.length / 2000))) {
          const t = allocatedTotal.t[k];
          worst = Math.max(worst, Math.abs(stepAt(otherBand.t, otherBand.top, t) - allocatedTotal.v[k]));
        }
        document.body.dataset.totalsMismatch = String(worst);
        return worst <= Math.max(1, 0.001 * yMaxFixedOrPeak());
      });
    }
  }
  function yMaxFixedOrPeak() { return isFinite(peakV) ? peakV : yMax; }

  return {
    el: tl.el, build, start, selfTest, totalsTest, showFinding, setHighlight,
    highlight: () => highlight,
    firstDrawMs: () => lastDrawMs,
  };
})();
