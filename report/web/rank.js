// memsnap report: one rank's window. Header and key stats, the active memory timeline (every
// large allocation a band, the rest one summary band, reserved memory on top), the allocator
// state at window end, and the top allocation sites at the peak.
'use strict';

(function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtExactBytes, fmtInt, fmtDur, fmtRel, fmtHex, fmtPct } = M;
  const D = M.readData();
  const app = document.getElementById('app');

  // ---- frames, stacks, categories ------------------------------------------------------------
  const F = obj(D.frames);
  const fName = arr(F.name), fFile = arr(F.file), fLine = arr(F.line);
  const stacks = arr(D.stacks);
  function stackFrames(id) {
    const s = stacks[id];
    if (!Array.isArray(s)) return [];
    return s.map((fid) => ({ name: str(fName[fid], '??'), file: str(fFile[fid]), line: num(fLine[fid], 0) }));
  }
  function topFrameText(id) {
    const fr = stackFrames(id);
    if (!fr.length) return null;
    const f = fr[0];
    return f.name + (f.file ? '  ' + f.file + (f.line > 0 ? ':' + f.line : '') : '');
  }
  const categories = arr(D.categories).map((c) => str(c, '?'));
  const catColors = M.categoryColors(categories);
  const catShades = catColors.map(M.shades);
  const greyShades = M.shades('#9aa1ad');
  const catName = (c) => (c >= 0 && c < categories.length ? categories[c] : 'uncategorised');
  const catColor = (c) => (c >= 0 && c < catColors.length ? catColors[c] : '#9aa1ad');

  // ---- bands: the allocations drawn one by one -----------------------------------------------
  const A = obj(D.allocs);
  const colSize = arr(A.size), colStart = arr(A.start_ns), colEnd = arr(A.end_ns);
  const nBands = Math.min(colSize.length, colStart.length);
  const statsIn = obj(D.stats);

  // Time domain: the window, [0, t1] relative to its opening.
  let tMax = num(D.t1_ns, NaN);
  if (!(tMax > 0)) {
    tMax = 0;
    for (let i = 0; i < nBands; i++) tMax = Math.max(tMax, num(colStart[i], 0), num(colEnd[i], 0));
    for (const t of arr(obj(D.totals).time_ns)) tMax = Math.max(tMax, num(t, 0));
    for (const t of arr(obj(D.other).time_ns)) tMax = Math.max(tMax, num(t, 0));
    if (!(tMax > 0)) tMax = 1;
  }
  const tMin = 0;

  // Bands are stacked in allocation order; index b is the position in that order.
  const order = new Int32Array(nBands);
  for (let i = 0; i < nBands; i++) order[i] = i;
  const startOf = (i) => num(colStart[i], -Infinity);
  order.sort((a, b) => startOf(a) - startOf(b) || a - b);
  const bSrc = order;
  const bSize = new Float64Array(nBands), bStart = new Float64Array(nBands), bEnd = new Float64Array(nBands);
  const bCat = new Int32Array(nBands), bStack = new Int32Array(nBands);
  const colCat = arr(A.category), colStack = arr(A.stack);
  for (let b = 0; b < nBands; b++) {
    const i = order[b];
    bSize[b] = Math.max(0, num(colSize[i], 0));
    bStart[b] = Math.max(num(colStart[i], tMin), -1e18);
    const e = colEnd[i];
    bEnd[b] = typeof e === 'number' && isFinite(e) && e >= 0 ? Math.max(e, bStart[b]) : Infinity;
    bCat[b] = num(colCat[i], -1);
    bStack[b] = num(colStack[i], -1);
  }
  const bEndDraw = (b) => (bEnd[b] === Infinity ? Math.max(tMax, bStart[b]) : bEnd[b]);

  // Vertical positions, as in an "active memory" view: a band sits on top of every earlier
  // allocation still live; when one below is freed, the bands above it drop by its size. Each
  // band is a step polygon, vertex k valid from vT[k] to the next vertex (or the band's end).
  // Vertices are computed once here; when a pathological free order would make too many of them,
  // shifts that fall in one time quantum of a band are merged (visible only when zoomed far in).
  const VERTEX_BUDGET = 3000000;
  const freeOrder = (() => {
    const list = [];
    for (let b = 0; b < nBands; b++) if (bEnd[b] !== Infinity) list.push(b);
    const a = Int32Array.from(list);
    a.sort((x, y) => bEnd[x] - bEnd[y] || x - y);
    return a;
  })();
  function sweep(quantum, vStart, vT, vO, sum) {
    const fill = !!vStart;
    const next = new Int32Array(nBands).fill(-1), prev = new Int32Array(nBands).fill(-1);
    let head = -1, tail = -1;
    const off = new Float64Array(nBands);
    const cnt = new Int32Array(nBands);
    const lastT = new Float64Array(nBands);
    let total = 0, cur = 0, ai = 0, fi = 0;
    const addVertex = (k, t) => {
      if (cnt[k] > 1 && quantum > 0 && Math.floor(t / quantum) === Math.floor(lastT[k] / quantum)) {
        if (fill) vO[vStart[k] + cnt[k] - 1] = off[k];
        return;
      }
      if (fill) { vT[vStart[k] + cnt[k]] = t; vO[vStart[k] + cnt[k]] = off[k]; }
      cnt[k]++;
      lastT[k] = t;
      total++;
    };
    while (ai < nBands || fi < freeOrder.length) {
      const isFree = fi < freeOrder.length && (ai >= nBands || bEnd[freeOrder[fi]] <= bStart[ai]);
      let t;
      if (isFree) {
        const j = freeOrder[fi++];
        t = bEnd[j];
        const s = bSize[j];
        for (let k = next[j]; k !== -1; k = next[k]) { off[k] -= s; addVertex(k, t); }
        if (prev[j] !== -1) next[prev[j]] = next[j]; else head = next[j];
        if (next[j] !== -1) prev[next[j]] = prev[j]; else tail = prev[j];
        cur -= s;
      } else {
        const a = ai++;
        t = bStart[a];
        off[a] = cur;
        cur += bSize[a];
        prev[a] = tail;
        if (tail !== -1) next[tail] = a; else head = a;
        tail = a;
        addVertex(a, t);
      }
      if (sum) {
        if (sum.n > 0 && sum.t[sum.n - 1] === t) sum.v[sum.n - 1] = cur;
        else { sum.t[sum.n] = t; sum.v[sum.n] = cur; sum.n++; }
      }
    }
    return { total, cnt };
  }
  const geometry = (() => {
    const t0 = performance.now();
    const span = Math.max(1, tMax - tMin);
    let quantum = 0;
    let counted = sweep(0);
    for (const div of [16384, 4096, 1024, 256]) {
      if (counted.total <= VERTEX_BUDGET) break;
      quantum = span / div;
      counted = sweep(quantum);
    }
    const vStart = new Int32Array(nBands + 1);
    for (let b = 0; b < nBands; b++) vStart[b + 1] = vStart[b] + counted.cnt[b];
    const vT = new Float64Array(counted.total), vO = new Float64Array(counted.total);
    const sum = { t: new Float64Array(2 * nBands + 1), v: new Float64Array(2 * nBands + 1), n: 0 };
    sweep(quantum, vStart, vT, vO, sum);
    return { vStart, vT, vO, sumT: sum.t.subarray(0, sum.n), sumV: sum.v.subarray(0, sum.n), quantum, ms: performance.now() - t0 };
  })();
  const { vStart, vT, vO } = geometry;

  // Last index i in sorted a[lo, hi) with a[i] <= x, or lo - 1.
  function lastLE(a, x, lo = 0, hi = a.length) {
    let l = lo, r = hi;
    while (l < r) { const m = (l + r) >> 1; if (a[m] <= x) l = m + 1; else r = m; }
    return l - 1;
  }
  function stepAt(ts, vs, t, before = 0) {
    const i = lastLE(ts, t);
    return i < 0 ? before : vs[i];
  }
  function bandOffsetAt(b, t) {
    const i = lastLE(vT, t, vStart[b], vStart[b + 1]);
    return vO[Math.max(vStart[b], i)];
  }

  // ---- step series: listed bands' total, the "other" band on top, totals -------------------
  function stepSeries(ts, vs) {
    const t = [], v = [];
    const n = Math.min(arr(ts).length, arr(vs).length);
    for (let i = 0; i < n; i++) {
      const a = num(ts[i]), b = num(vs[i]);
      if (isFinite(a) && isFinite(b)) { t.push(a); v.push(b); }
    }
    let sorted = true;
    for (let i = 1; i < t.length; i++) if (t[i] < t[i - 1]) { sorted = false; break; }
    if (!sorted) {
      const idx = t.map((_, i) => i).sort((x, y) => t[x] - t[y] || x - y);
      return { t: Float64Array.from(idx.map((i) => t[i])), v: Float64Array.from(idx.map((i) => v[i])) };
    }
    return { t: Float64Array.from(t), v: Float64Array.from(v) };
  }
  const Oth = obj(D.other);
  const other = stepSeries(Oth.time_ns, Oth.bytes);
  const otherCount = stepSeries(Oth.time_ns, Oth.count);
  const hasOther = other.t.length > 0 && other.v.some((x) => x > 0);
  // The summary band sits on top of the listed bands so that it never moves them.
  const otherBand = (() => {
    const { sumT, sumV } = geometry;
    const T = [], B = [], Tp = [];
    let i = 0, j = 0;
    while (i < sumT.length || j < other.t.length) {
      let t;
      if (j >= other.t.length || (i < sumT.length && sumT[i] <= other.t[j])) t = sumT[i];
      else t = other.t[j];
      while (i < sumT.length && sumT[i] === t) i++;
      while (j < other.t.length && other.t[j] === t) j++;
      const bot = i > 0 ? sumV[i - 1] : 0;
      const ot = j > 0 ? other.v[j - 1] : 0;
      T.push(t); B.push(bot); Tp.push(bot + ot);
    }
    return { t: Float64Array.from(T), bot: Float64Array.from(B), top: Float64Array.from(Tp) };
  })();
  const Tot = obj(D.totals);
  const reserved = stepSeries(Tot.time_ns, Tot.reserved);
  const allocatedTotal = stepSeries(Tot.time_ns, Tot.allocated);
  const batches = arr(D.batches).map((b) => ({ batch: obj(b).batch, t: num(obj(b).time_ns) })).filter((b) => isFinite(b.t));
  const ooms = arr(D.ooms).map((o) => Object.assign({}, obj(o), { t: num(obj(o).time_ns) })).filter((o) => isFinite(o.t));
  const peakT = num(statsIn.peak_allocated_time_ns);
  const peakV = num(statsIn.peak_allocated);

  function maxIn(ts, vs, t0, t1) {
    if (!ts.length) return 0;
    let i = Math.max(0, lastLE(ts, t0));
    const end = lastLE(ts, t1);
    let m = 0;
    for (; i <= end; i++) if (vs[i] > m) m = vs[i];
    if (end < 0 && ts.length) m = 0;
    return m;
  }

  // ---- header --------------------------------------------------------------------------------
  const links = obj(D.links);
  const rank = D.rank;
  const runName = str(D.run_name, 'unnamed run');
  app.append(M.topbar(runName + ' · rank ' + str(rank, '?'), [
    { label: '← All ranks', href: links.index, title: 'cross-rank overview' },
    { label: '‹ Previous window', href: links.prev, title: links.prev ? 'previous window of this rank' : 'no earlier window' },
    { label: 'Next window ›', href: links.next, title: links.next ? 'next window of this rank' : 'no later window' },
  ]));
  const main = h('main');
  app.append(main);

  const status = str(D.status, 'unknown');
  const badges = h('div', { class: 'badges' }, M.statusBadge(status));
  if (D.oom || ooms.length) badges.append(h('span', { class: 'badge solid-bad', dataset: { oom: '1' } }, 'OOM' + (ooms.length > 1 ? ' ×' + ooms.length : '')));
  if (num(statsIn.dropped, 0) > 0) badges.append(h('span', { class: 'badge warn' }, fmtInt(statsIn.dropped) + ' events dropped'));
  // How the batch boundaries were found: the source's own marks, or inferred from the trace.
  const bm = obj(D.batch_method);
  const bmMethod = str(bm.method, 'recorded');
  const bmInferred = bmMethod !== 'recorded';
  const bmWords = { recurring_annotation: 'a recurring annotation', recurring_frame: 'a recurring frame', periodicity: 'the allocation pattern', none: 'nothing' };
  const bmText = bmMethod === 'none'
    ? 'no batch boundaries found'
    : 'batches inferred from ' + (bmWords[bmMethod] || bmMethod) + ' · confidence ' + fmtPct(num(bm.confidence, 0));
  if (bmInferred) {
    badges.append(h('span', { class: 'badge ' + (bmMethod === 'none' || num(bm.confidence, 0) < 0.5 ? 'warn' : 'accent'),
      title: str(bm.detail, ''), dataset: { batchMethod: bmMethod } }, bmText));
  }
  const window_ = D.batch_start != null || D.batch_end != null
    ? 'batches ' + str(D.batch_start, '?') + '–' + str(D.batch_end, '?') : 'window';
  main.append(h('div', { class: 'page-head' },
    h('h1', null, 'Rank ' + str(rank, '?'), D.world_size != null ? h('span', { style: 'color:var(--muted);font-weight:500' }, ' / ' + D.world_size) : null),
    h('div', { class: 'sub' },
      h('span', null, 'run ', h('b', null, runName)),
      h('span', null, h('b', null, window_)),
      D.host != null ? h('span', null, 'host ', h('b', null, str(D.host))) : null,
      D.device != null ? h('span', null, 'device ', h('b', null, str(D.device))) : null,
      D.source != null ? h('span', null, 'source ', h('b', null, str(D.source))) : null,
      h('span', null, 'span ', h('b', null, fmtDur(tMax)))),
    badges));

  const stats = h('div', { class: 'stats' });
  const pr = num(statsIn.peak_reserved);
  stats.append(
    M.statTile('Peak allocated', fmtBytes(peakV), isFinite(peakT) ? 'at ' + fmtRel(peakT) : fmtExactBytes(peakV)),
    M.statTile('Peak reserved', fmtBytes(pr), isFinite(pr) && isFinite(peakV) && pr > 0 ? fmtPct(peakV / pr) + ' of it allocated at peak' : null),
    M.statTile('Live at open', fmtBytes(num(statsIn.live_at_open)), 'allocated before the window'),
    M.statTile('Live at close', fmtBytes(num(statsIn.live_at_close)),
      isFinite(num(statsIn.live_at_close)) && isFinite(num(statsIn.live_at_open)) ? M.fmtSignedBytes(statsIn.live_at_close - statsIn.live_at_open) + ' over the window' : null,
      statsIn.live_at_close > statsIn.live_at_open * 1.05 + 1048576 ? 'warn' : null),
    M.statTile('Fragmentation at peak', fmtBytes(num(statsIn.fragmentation_at_peak)), isFinite(pr) && pr > 0 ? fmtPct(num(statsIn.fragmentation_at_peak) / pr) + ' of reserved' : 'reserved but unused'),
    M.statTile('Events', fmtInt(num(statsIn.n_events)), fmtInt(nBands) + ' drawn one by one' + (num(statsIn.dropped, 0) > 0 ? ' · ' + fmtInt(statsIn.dropped) + ' dropped' : ''), num(statsIn.dropped, 0) > 0 ? 'warn' : null));
  if (ooms.length) {
    const o = ooms[0];
    stats.append(M.statTile('Out of memory: request', fmtBytes(num(o.size)), 'at ' + fmtRel(o.t) + ', ' + fmtBytes(num(o.device_free)) + ' free on device', 'bad'));
  }
  main.append(stats);

  // ---- timeline ------------------------------------------------------------------------------
  const view = { t0: tMin, t1: tMax };
  let colorBy = 'category';
  let highlight = null; // {kind: 'stack'|'category', id}
  let hover = null, pinned = null; // {type: 'band', b} | {type: 'other', t} | {type: 'oom', i}
  let hoverPos = null; // {x, y, t}
  let drag = null;
  let fitY = true;
  let yMaxFixed = 0;

  const tl = M.card('Active memory timeline', { id: 'timeline', hint: 'live allocations stacked in allocation order; a freed band collapses and the bands above drop' });
  main.append(tl.el);
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
      const col = colorFor(b);
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
    if (sitesTable) sitesTable.refresh();
    schedule();
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
  const local = (ev, el) => { const r = el.getBoundingClientRect(); return { x: ev.clientX - r.left, y: ev.clientY - r.top }; };
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
    canvas.focus();
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

  // ---- allocator state at window end ---------------------------------------------------------
  const S = obj(D.segments), Bk = obj(D.blocks);
  const segAddr = arr(S.addr), segSize = arr(S.size), segN = arr(S.nblocks);
  const nSeg = segSize.length;
  const blkOff = arr(Bk.offset), blkSize = arr(Bk.size), blkState = arr(Bk.state), blkStack = arr(Bk.stack);
  const segFirst = new Int32Array(nSeg + 1);
  for (let s = 0; s < nSeg; s++) segFirst[s + 1] = segFirst[s] + num(segN[s], 0);
  const STATE = [
    { name: 'inactive (free, reusable)', short: 'inactive', color: () => M.cssVar('--grid') },
    { name: 'allocated', short: 'allocated', color: () => '#4e79a7' },
    { name: 'pending free (waiting on a stream)', short: 'pending free', color: () => '#f28e2b' },
  ];
  const segCard = M.card('Allocator state at window end', { id: 'segments', hint: 'each segment a bar in address order, split into its blocks' });
  main.append(segCard.el);
  let segLayout = null;
  const segCanvas = h('canvas', { class: 'interactive', 'aria-label': 'allocator segments' });
  if (nSeg === 0) {
    segCard.body.append(M.emptyNote('no segments recorded'));
  } else {
    const byState = [0, 0, 0];
    for (let k = 0; k < segFirst[nSeg]; k++) { const st = num(blkState[k], 0); byState[st >= 0 && st <= 2 ? st : 0] += num(blkSize[k], 0); }
    let totalSeg = 0;
    for (let s = 0; s < nSeg; s++) totalSeg += num(segSize[s], 0);
    const leg = h('div', { class: 'legend', style: 'margin-bottom:8px' },
      h('span', { class: 'item' }, h('b', null, fmtInt(nSeg)), 'segments'),
      h('span', { class: 'item' }, h('b', null, fmtBytes(totalSeg)), 'reserved'),
      ...STATE.map((st, i) => h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:' + st.color() + (i === 0 ? ';border:1px solid var(--line)' : '') }), st.short, h('b', null, fmtBytes(byState[i])))),
      totalSeg > 0 ? h('span', { class: 'item' }, 'inactive share', h('b', null, fmtPct(byState[0] / totalSeg))) : null);
    segCard.body.append(leg, h('div', { class: 'canvas-wrap', style: 'max-height:420px;overflow-y:auto' }, segCanvas));
  }
  // Layout: segments laid end to end, wrapping over rows; every segment at least a few pixels.
  function drawSegments() {
    if (nSeg === 0) return;
    const width = Math.max(320, segCard.body.clientWidth - 32);
    const ROW = 18, GAP = 6, MIN_PX = 4, SEP = 3;
    let total = 0;
    for (let s = 0; s < nSeg; s++) total += Math.max(0, num(segSize[s], 0));
    const targetRows = Math.min(24, Math.max(2, Math.ceil(nSeg / 40)));
    const bpp = Math.max(1, total / (targetRows * width * 0.9));
    const start = new Float64Array(nSeg), len = new Float64Array(nSeg);
    let L = 0;
    for (let s = 0; s < nSeg; s++) {
      start[s] = L;
      len[s] = Math.max(MIN_PX, num(segSize[s], 0) / bpp);
      L += len[s] + SEP;
    }
    const rows = Math.max(1, Math.ceil(L / width));
    const height = rows * (ROW + GAP);
    const c = M.setupCanvas(segCanvas, width, height);
    c.clearRect(0, 0, width, height);
    const span = (a, b, color) => {
      while (a < b) {
        const row = Math.floor(a / width);
        const x0 = a - row * width, x1 = Math.min(width, x0 + (b - a));
        c.fillStyle = color;
        c.fillRect(x0, row * (ROW + GAP), Math.max(0.75, x1 - x0), ROW);
        a += x1 - x0;
        if (x1 - x0 <= 0) break;
      }
    };
    const colors = STATE.map((st) => st.color());
    for (let s = 0; s < nSeg; s++) {
      span(start[s], start[s] + len[s], colors[0]);
      const size = Math.max(1, num(segSize[s], 0));
      for (let k = segFirst[s]; k < segFirst[s + 1]; k++) {
        const st = num(blkState[k], 0);
        if (st === 0) continue;
        const a = start[s] + (num(blkOff[k], 0) / size) * len[s];
        const b = start[s] + (Math.min(size, num(blkOff[k], 0) + num(blkSize[k], 0)) / size) * len[s];
        span(a, Math.max(b, a + 0.75), colors[st] || colors[1]);
      }
    }
    segLayout = { start, len, width, ROW, GAP };
    segCanvas.dataset.segments = String(nSeg);
  }
  function segHit(x, y) {
    if (!segLayout) return null;
    const { start, len, width, ROW, GAP } = segLayout;
    const row = Math.floor(y / (ROW + GAP));
    if (y - row * (ROW + GAP) > ROW) return null;
    const L = row * width + x;
    const s = lastLE(start, L);
    if (s < 0 || L > start[s] + len[s]) return null;
    const size = Math.max(1, num(segSize[s], 0));
    const off = ((L - start[s]) / len[s]) * size;
    let blk = -1;
    for (let k = segFirst[s]; k < segFirst[s + 1]; k++) if (off >= num(blkOff[k], 0) && off < num(blkOff[k], 0) + num(blkSize[k], 0)) { blk = k; break; }
    return { s, blk };
  }
  segCanvas.addEventListener('mousemove', (ev) => {
    const p = local(ev, segCanvas);
    const hit = segHit(p.x, p.y);
    if (!hit) { M.hideTip(); return; }
    const s = hit.s;
    let alloc = 0;
    for (let k = segFirst[s]; k < segFirst[s + 1]; k++) if (num(blkState[k], 0) !== 0) alloc += num(blkSize[k], 0);
    const segPairs = [['segment', fmtHex(segAddr[s]) + ' · ' + fmtBytes(num(segSize[s]))], ['pool', str(arr(S.pool)[s]) || '–'],
      ['stream', str(arr(S.stream)[s], '–')], ['device', str(arr(S.device)[s], '–')], ['blocks', fmtInt(num(segN[s], 0))], ['in use', fmtBytes(alloc) + ' (' + fmtPct(alloc / Math.max(1, num(segSize[s], 0))) + ')']];
    if (hit.blk >= 0) {
      const k = hit.blk;
      const st = STATE[num(blkState[k], 0)] || STATE[0];
      const top = topFrameText(num(blkStack[k], -1));
      M.tip(ev.clientX, ev.clientY, M.tipBody(fmtBytes(num(blkSize[k])) + ' · ' + st.short,
        [['block', M.addHex(segAddr[s], num(blkOff[k], 0))], ['offset', fmtBytes(num(blkOff[k], 0))], ...segPairs],
        top ? h('div', { class: 'fr' }, top) : null));
    } else {
      M.tip(ev.clientX, ev.clientY, M.tipBody('Segment ' + fmtBytes(num(segSize[s])), segPairs));
    }
  });
  segCanvas.addEventListener('mouseleave', () => M.hideTip());

  // ---- top allocation sites at the peak ------------------------------------------------------
  const sites = arr(D.sites).map((s, i) => Object.assign({ idx: i + 1 }, obj(s)));
  const siteTotal = isFinite(peakV) && peakV > 0 ? peakV : sites.reduce((a, s) => a + num(s.bytes, 0), 0);
  const sitesCard = M.card('Top allocation sites at the peak', { id: 'sites', hint: 'bytes live at the peak, by allocation site; click a row for its stack' });
  main.append(sitesCard.el);
  sitesCard.body.classList.add('flush');
  let sitesTable = null;
  const siteName = (s) => str(s.name) || topFrameText(num(s.stack, -1)) || '(unknown site)';
  if (sites.length === 0) {
    sitesCard.body.append(M.emptyNote('no allocation sites recorded'));
  } else {
    sitesTable = M.dataTable({
      rows: sites,
      pageSize: 25,
      sort: { key: 'bytes', dir: 'desc' },
      filterText: (s) => siteName(s) + ' ' + catName(num(s.category, -1)),
      filterPlaceholder: 'Filter sites…',
      rowAttrs: (s) => ({ class: 'site-row', dataset: { bytes: num(s.bytes, 0) } }),
      columns: [
        { key: 'idx', label: '#', num: true, value: (s) => s.idx },
        { key: 'site', label: 'Site', value: (s) => siteName(s).toLowerCase(), render: (s) => h('span', { class: 'site' }, siteName(s)) },
        { key: 'category', label: 'Category', value: (s) => catName(num(s.category, -1)), render: (s) => h('span', { class: 'legend' }, h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:' + catColor(num(s.category, -1)) }), catName(num(s.category, -1)))) },
        { key: 'bytes', label: 'Bytes at peak', num: true, value: (s) => num(s.bytes, 0), render: (s) => h('span', { title: fmtExactBytes(num(s.bytes)) }, fmtBytes(num(s.bytes))) },
        { key: 'share', label: 'Share of peak', value: (s) => num(s.bytes, 0), render: (s) => {
          const f = siteTotal > 0 ? num(s.bytes, 0) / siteTotal : 0;
          return h('div', { class: 'share' }, h('div', { class: 'bar' }, h('i', { style: 'width:' + (Math.min(1, f) * 100).toFixed(1) + '%;background:' + catColor(num(s.category, -1)) })), h('span', { class: 'pct' }, fmtPct(f)));
        } },
        { key: 'count', label: 'Allocations', num: true, value: (s) => num(s.count, 0), render: (s) => fmtInt(num(s.count)) },
        { key: 'avg', label: 'Average', num: true, value: (s) => num(s.bytes, 0) / Math.max(1, num(s.count, 1)), render: (s) => fmtBytes(num(s.bytes, 0) / Math.max(1, num(s.count, 1))) },
        { key: 'hl', label: '', render: (s) => {
          const id = num(s.stack, -1);
          if (id < 0) return '';
          const on = highlight && highlight.kind === 'stack' && highlight.id === id;
          return h('button', { class: on ? 'on' : null, title: 'highlight this site in the timeline', onclick: () => { setHighlight({ kind: 'stack', id }); tl.el.scrollIntoView({ behavior: 'smooth', block: 'start' }); } }, on ? 'Shown' : 'Show');
        } },
      ],
      expand: (s) => {
        const id = num(s.stack, -1);
        let bands = 0;
        for (let b = 0; b < nBands; b++) if (bStack[b] === id) bands++;
        return h('div', null, h('div', { class: 'hint', style: 'color:var(--muted);font-size:12.5px' }, fmtInt(bands) + ' allocations of this site are drawn in the timeline'), M.stackList(stackFrames(id)));
      },
    });
    sitesCard.body.append(sitesTable.el);
  }

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

  // ---- go ------------------------------------------------------------------------------------
  buildLegend();
  updateReadout(null);
  updateDetail();
  layout();
  draw();
  drawSegments();
  M.onWidthChange(plotBox, () => { layout(); draw(); });
  M.onWidthChange(segCard.body, () => drawSegments());
  canvas.dataset.bands = String(nBands);
  canvas.dataset.vertices = String(vT.length);
  canvas.dataset.quantum = String(geometry.quantum);
  document.body.dataset.geometryMs = geometry.ms.toFixed(1);
  M.ready({ bands: nBands, firstDrawMs: lastDrawMs.toFixed(1) });

  // ---- self test (#selftest): drives the UI the way a user would and reports in body[data-selftest]
  if (M.selftest) {
    const results = [];
    const check = (name, fn) => { let ok = false; try { ok = !!fn(); } catch (e) { ok = false; results.push(name + '=error:' + e.message); return; } results.push(name + '=' + (ok ? 'ok' : 'fail')); };
    const rect = canvas.getBoundingClientRect();
    const fire = (el, type, x, y, extra) => el.dispatchEvent(new MouseEvent(type, Object.assign({ bubbles: true, clientX: x, clientY: y, button: 0 }, extra)));
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
    if (sitesTable) {
      check('sort', () => {
        sitesCard.el.querySelector('th[data-key="bytes"]').click();
        const th = sitesCard.el.querySelector('th[data-key="bytes"]');
        const vals = Array.from(sitesCard.el.querySelectorAll('tr.site-row')).map((r) => Number(r.dataset.bytes));
        return th.getAttribute('aria-sort') === 'ascending' && vals.every((v, i) => i === 0 || vals[i - 1] <= v);
      });
      check('expand', () => { sitesCard.el.querySelector('tr.site-row').click(); return !!sitesCard.el.querySelector('tr.detail ol.stack, tr.detail .none'); });
    }
    if (nSeg > 0) {
      const r = segCanvas.getBoundingClientRect();
      check('segments', () => { fire(segCanvas, 'mousemove', r.left + 2, r.top + 5); const t = document.querySelector('.tip'); return t && t.style.display === 'block' && /segment/.test(t.textContent); });
    }
    // The stacked bands plus the summary band must add up to the recorded total allocated.
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
    document.body.dataset.selftest = results.join(' ');
  }
  function yMaxFixedOrPeak() { return isFinite(peakV) ? peakV : yMax; }
})();
