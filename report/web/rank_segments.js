// memsnap report, rank page: the allocator's state at the window's end. Each segment a bar in
// address order, split into its blocks (allocated, pending free, inactive); hover for a block's
// address, size and stack.
'use strict';

window.memsnapRank.segments = (function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtInt, fmtHex, fmtPct } = M;
  const { D, topFrameText, lastLE, local } = window.memsnapRank;

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

  function build(main) {
    main.append(segCard.el);
  }
  function start() {
    drawSegments();
    M.onWidthChange(segCard.body, () => drawSegments());
  }
  // Self test (#selftest, rank.js): hovering a segment shows its tooltip.
  function selfTest(check, fire) {
    if (nSeg > 0) {
      const r = segCanvas.getBoundingClientRect();
      check('segments', () => { fire(segCanvas, 'mousemove', r.left + 2, r.top + 5); const t = document.querySelector('.tip'); return t && t.style.display === 'block' && /segment/.test(t.textContent); });
    }
  }

  return { build, start, selfTest };
})();
