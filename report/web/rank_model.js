// memsnap report, rank page: the window's data, read once and shared by the page's views
// (rank_header.js, rank_findings.js, rank_timeline.js, rank_flame.js, rank_segments.js,
// rank_sites.js; rank.js puts them on the page). Frames, stacks and categories; the allocations
// drawn one by one (bands) with their stacked geometry; the step series (the summed band,
// allocated, reserved); batches, OOMs and the peak. Read-only once built: window.memsnapRank.
'use strict';

window.memsnapRank = (function () {
  const M = window.memsnap;
  const { arr, obj, num, str } = M;
  const D = M.readData();
  // The findings about this rank and window (report.cpp's tail of the page), shown first.
  const findings = arr(M.readJson('memsnap-findings')).map(obj);

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

  // The site of each page stack, as the analysis names it (findings name sites).
  const stackSites = arr(D.stack_sites), siteNames = arr(D.site_names);
  const siteOfStack = (id) => (id >= 0 && id < stackSites.length ? str(siteNames[num(stackSites[id], -1)], '') : '<no stack>');

  // How the batch boundaries were found: the source's own marks, or inferred from the trace.
  const bm = obj(D.batch_method);
  const bmMethod = str(bm.method, 'recorded');
  const bmInferred = bmMethod !== 'recorded';

  // A mouse event's position in an element's CSS pixels.
  const local = (ev, el) => { const r = el.getBoundingClientRect(); return { x: ev.clientX - r.left, y: ev.clientY - r.top }; };

  return {
    D, findings, statsIn, F, stacks, stackFrames, topFrameText, categories, catColors, catShades, greyShades, catName, catColor,
    A, nBands, tMin, tMax, bSrc, bSize, bStart, bEnd, bCat, bStack, bEndDraw, geometry, vStart, vT, vO,
    lastLE, stepAt, bandOffsetAt, other, otherCount, hasOther, otherBand, reserved, allocatedTotal, batches, ooms, peakT, peakV, maxIn,
    stackSites, siteNames, siteOfStack, bm, bmMethod, bmInferred, local,
  };
})();
