// memsnap diff: the diff's cross page (body.page-diff: headline with paired peak bars per rank,
// findings resolved and new, the site table, categories base against new, the ranks) and its rank
// page (body.page-diff-rank: both runs' batches one above the other, sites and categories).
// Reads diff.json's data (memsnap/diff.hpp); every field optional. Canvases scale to 1000s of ranks.
'use strict';

(function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtSignedBytes, fmtInt } = M;
  const D = M.readData();
  const app = document.getElementById('app');
  const BASE = '#9aa1ad', NEW = '#4f46e5', GROW = '#d92d20', SHRINK = '#1a7f4b';
  const pair = (v) => { const a = arr(v); return [num(a[0], 0), num(a[1], 0)]; };
  const delta = (v) => { const [b, n] = pair(v); return n - b; };
  const pct = (v) => { const [b, n] = pair(v); return b > 0 ? ((n - b) / b * 100).toFixed(1) + '%' : n > 0 ? 'new' : '0%'; };
  const deltaCell = (d) => h('span', { style: 'color:' + (d > 0 ? GROW : d < 0 ? SHRINK : 'inherit') }, fmtSignedBytes(d));
  const noise = obj(D.noise);
  const labelOf = (s) => str(obj(s).label, '?');
  const CATEGORIES = ['parameters', 'gradients', 'optimizer_state', 'all_gather', 'reduce_scatter', 'activations', 'other'];

  function paired(title, v, note) {
    const [b, n] = pair(v);
    return M.statTile(title, fmtBytes(b) + ' → ' + fmtBytes(n), note || (fmtSignedBytes(n - b) + ' (' + pct(v) + ')'));
  }

  // Paired bars: one slot per item, base in grey behind, new in colour in front.
  function pairedBars(items, opts) {
    const wrap = h('div', { class: 'canvas-wrap' });
    const canvas = h('canvas', { 'aria-label': opts.label || 'paired bars' });
    wrap.append(canvas);
    function draw() {
      const W = Math.max(320, wrap.clientWidth || 900), H = opts.height || 200, L = 64, B = 22;
      const ctx = M.setupCanvas(canvas, W, H);
      const max = Math.max(1, ...items.map((x) => Math.max(x.base, x.now)));
      const { ticks } = M.byteTicks(max, 4);
      ctx.font = '11px ' + M.cssVar('--sans');
      ctx.fillStyle = M.cssVar('--muted');
      ctx.strokeStyle = M.cssVar('--grid');
      const y = (v) => H - B - (v / max) * (H - B - 8);
      for (const t of ticks) {
        ctx.beginPath(); ctx.moveTo(L, y(t)); ctx.lineTo(W, y(t)); ctx.stroke();
        ctx.fillText(fmtBytes(t), 2, y(t) + 4);
      }
      const n = Math.max(1, items.length), slot = (W - L) / n;
      items.forEach((x, i) => {
        const x0 = L + i * slot;
        ctx.fillStyle = BASE;
        ctx.fillRect(x0, y(x.base), Math.max(1, slot * 0.9), H - B - y(x.base));
        ctx.fillStyle = x.changed ? (x.now > x.base ? GROW : SHRINK) : NEW;
        const w = Math.max(1, slot * 0.55);
        ctx.fillRect(x0 + slot * 0.35 > x0 + slot - w ? x0 : x0 + slot * 0.35, y(x.now), w, H - B - y(x.now));
      });
      ctx.fillStyle = M.cssVar('--muted');
      const every = Math.ceil(n / Math.max(1, Math.floor((W - L) / 40)));
      items.forEach((x, i) => { if (i % every === 0) ctx.fillText(x.label, L + i * slot, H - 6); });
      canvas.onmousemove = (ev) => {
        const r = canvas.getBoundingClientRect();
        const i = Math.floor((ev.clientX - r.left - L) / slot);
        if (i < 0 || i >= items.length) return M.hideTip();
        const x = items[i];
        M.tip(ev.clientX, ev.clientY, M.tipBody(x.label, [['base', fmtBytes(x.base)], ['new', fmtBytes(x.now)],
          ['change', fmtSignedBytes(x.now - x.base)], ['beyond noise', x.changed ? 'yes' : 'no']]));
      };
      canvas.onmouseleave = M.hideTip;
    }
    requestAnimationFrame(draw);
    M.onWidthChange(wrap, draw);
    draw();
    const legend = h('div', { class: 'legend' },
      h('span', null, h('span', { class: 'sw', style: 'background:' + BASE }), ' base'),
      h('span', null, h('span', { class: 'sw', style: 'background:' + NEW }), ' new'),
      h('span', null, h('span', { class: 'sw', style: 'background:' + GROW }), ' grew beyond noise'),
      h('span', null, h('span', { class: 'sw', style: 'background:' + SHRINK }), ' shrank beyond noise'));
    return h('div', { class: 'chart-block' }, legend, wrap);
  }

  function siteName(s) {
    const o = obj(s);
    return str(o.new_name) || str(o.base_name) || str(o.key);
  }

  function sitesTable(sites, overRanks) {
    const cols = [
      { key: 'site', label: 'site', value: (s) => siteName(s), render: (s) => h('span', { class: 'mono', title: str(s.key) }, siteName(s)) },
      { key: 'cat', label: 'category', value: (s) => str(s.category) },
      { key: 'base', label: 'base', num: true, value: (s) => pair(s.bytes)[0], render: (s) => fmtBytes(pair(s.bytes)[0]) },
      { key: 'new', label: 'new', num: true, value: (s) => pair(s.bytes)[1], render: (s) => fmtBytes(pair(s.bytes)[1]) },
      { key: 'delta', label: 'delta', num: true, value: (s) => Math.abs(delta(s.bytes)), render: (s) => deltaCell(delta(s.bytes)) },
      { key: 'moved', label: 'moved', value: (s) => (s.moved ? 1 : 0), render: (s) => (s.moved ? h('span', { title: 'was ' + str(s.base_name) }, 'moved') : '') },
      { key: 'noise', label: 'beyond noise', value: (s) => (s.beyond_noise ? 1 : 0), render: (s) => (s.beyond_noise ? 'yes' : 'no') },
    ];
    if (overRanks) {
      cols.push({ key: 'ranks', label: 'ranks changed', num: true, value: (s) => num(s.ranks_changed, 0), render: (s) => fmtInt(num(s.ranks_changed, 0)) });
      cols.push({ key: 'top', label: 'most on rank', num: true, value: (s) => num(s.top_rank, -1),
        render: (s) => num(s.top_rank, -1) >= 0 ? 'rank ' + s.top_rank + ' (' + fmtSignedBytes(num(s.top_rank_delta, 0)) + ')' : '' });
    }
    const t = M.dataTable({ columns: cols, rows: arr(sites).map(obj), sort: { key: 'delta', dir: 'desc' }, pageSize: 25,
      filterText: (s) => siteName(s) + ' ' + str(s.category), rowAttrs: (s) => ({ dataset: { site: str(s.key), delta: delta(s.bytes) } }) });
    return t.el;
  }

  function categoriesTable(cats) {
    const rows = Object.entries(obj(cats)).map(([k, v]) => ({ k, v })).filter((x) => pair(x.v)[0] > 0 || pair(x.v)[1] > 0);
    return M.dataTable({
      columns: [
        { key: 'cat', label: 'category', value: (x) => x.k, render: (x) => h('span', null, h('span', { class: 'sw', style: 'background:' + M.categoryColors([x.k])[0] }), ' ', x.k) },
        { key: 'base', label: 'base', num: true, value: (x) => pair(x.v)[0], render: (x) => fmtBytes(pair(x.v)[0]) },
        { key: 'new', label: 'new', num: true, value: (x) => pair(x.v)[1], render: (x) => fmtBytes(pair(x.v)[1]) },
        { key: 'delta', label: 'delta', num: true, value: (x) => Math.abs(delta(x.v)), render: (x) => deltaCell(delta(x.v)) },
        { key: 'pct', label: 'change', num: true, value: (x) => delta(x.v), render: (x) => pct(x.v) },
      ],
      rows, sort: { key: 'delta', dir: 'desc' }, pageSize: 20, rowAttrs: (x) => ({ dataset: { category: x.k } }),
    }).el;
  }

  function findingsBlock(findings) {
    const list = arr(findings).map(obj);
    if (list.length === 0) return h('div', { class: 'findings-none' }, 'No findings on either side.');
    return M.dataTable({
      columns: [
        { key: 'state', label: 'state', value: (f) => str(f.state), render: (f) => h('span', { class: 'chip kind-' + (f.state === 'new' ? 'leak' : f.state === 'resolved' ? 'missing' : 'spike') }, str(f.state)) },
        { key: 'kind', label: 'finding', value: (f) => str(obj(f.base).kind || obj(f.new).kind) },
        { key: 'rank', label: 'rank', num: true, value: (f) => num(obj(f.base).rank, num(obj(f.new).rank, -1)) },
        { key: 'site', label: 'site', value: (f) => str(obj(f.base).site || obj(f.new).site), render: (f) => h('span', { class: 'mono' }, str(obj(f.base).site || obj(f.new).site)) },
        { key: 'then', label: 'bytes then', num: true, value: (f) => num(obj(f.base).bytes, 0), render: (f) => (f.base ? fmtBytes(num(obj(f.base).bytes, 0)) : '–') },
        { key: 'now', label: 'bytes now', num: true, value: (f) => num(obj(f.new).bytes, 0), render: (f) => (f.new ? fmtBytes(num(obj(f.new).bytes, 0)) : '–') },
      ],
      rows: list, sort: { key: 'state', dir: 'asc' }, pageSize: 20, rowAttrs: (f) => ({ dataset: { state: str(f.state) } }),
    }).el;
  }

  function noiseNote() {
    return h('div', { class: 'hint', dataset: { noise: num(noise.threshold, 0) } }, 'Noise level used: ' + fmtBytes(num(noise.threshold, NaN)) + ' (' + str(noise.how) + ')');
  }

  function crossPage() {
    const ranks = arr(D.ranks).map(obj);
    const main = h('main');
    app.append(M.topbar('diff · ' + labelOf(D.base) + ' → ' + labelOf(D.new), [{ label: 'diff.json', href: 'diff.json' }]));
    app.append(main);
    main.append(h('div', { class: 'page-head' }, h('h1', { id: 'headline' }, str(D.headline, 'memsnap diff'))));
    const stats = h('div', { class: 'stats' },
      M.statTile('ranks changed', fmtInt(num(D.ranks_changed, 0)) + ' of ' + fmtInt(ranks.length), D.no_change ? 'no change beyond noise' : null),
      paired('peak, median rank', D.median_peak), paired('peak, highest rank', D.max_peak),
      M.statTile('noise level', fmtBytes(num(noise.threshold, NaN)), 'ranks ' + fmtBytes(num(noise.rank_spread, 0)) + ', batches ' + fmtBytes(num(noise.batch_spread, 0))));
    main.append(stats);
    const fail = obj(D.fail_on_growth);
    if (fail.failed) main.append(h('div', { class: 'error-banner', id: 'growth-gate' }, 'memory regression: ' + str(fail.line)));

    const peak = M.card('Peak allocated per rank, base against new', { hint: 'grey: base; in front: new' });
    peak.body.append(pairedBars(ranks.map((r) => ({ label: 'rank ' + num(r.rank, 0), base: pair(r.peak_allocated)[0], now: pair(r.peak_allocated)[1], changed: r.changed === true && delta(r.peak_allocated) !== 0 })),
      { label: 'peak allocated per rank', height: 220 }));
    peak.body.append(noiseNote());
    main.append(peak.el);

    const fc = M.card('Findings: resolved, new, still there', { id: 'findings' });
    fc.body.append(findingsBlock(D.findings));
    main.append(fc.el);

    const sc = M.card('Sites: bytes at the peak, over the ranks', { id: 'sites', flush: true, hint: 'a site is a code path (function and file); "moved": the same code at another line' });
    sc.body.append(sitesTable(D.sites, true));
    main.append(sc.el);

    const cc = M.card('Categories at the peak, over the ranks', { id: 'categories', flush: true });
    cc.body.append(categoriesTable(D.categories));
    main.append(cc.el);

    const rc = M.card('Ranks', { id: 'ranks', flush: true, hint: 'a rank that changed beyond noise has a page' });
    rc.body.append(M.dataTable({
      columns: [
        { key: 'rank', label: 'rank', num: true, value: (r) => num(r.rank, 0), render: (r) => (r.page ? h('a', { href: r.page }, 'rank ' + r.rank) : 'rank ' + r.rank) },
        { key: 'peak', label: 'peak base → new', num: true, value: (r) => pair(r.peak_allocated)[1], render: (r) => fmtBytes(pair(r.peak_allocated)[0]) + ' → ' + fmtBytes(pair(r.peak_allocated)[1]) },
        { key: 'dpeak', label: 'Δ peak', num: true, value: (r) => Math.abs(delta(r.peak_allocated)), render: (r) => deltaCell(delta(r.peak_allocated)) },
        { key: 'dpers', label: 'Δ persistent', num: true, value: (r) => Math.abs(delta(r.persistent)), render: (r) => deltaCell(delta(r.persistent)) },
        { key: 'dend', label: 'Δ held at the end', num: true, value: (r) => Math.abs(delta(r.live_at_close)), render: (r) => deltaCell(delta(r.live_at_close)) },
        { key: 'dres', label: 'Δ reserved', num: true, value: (r) => Math.abs(delta(r.peak_reserved)), render: (r) => deltaCell(delta(r.peak_reserved)) },
        { key: 'what', label: 'changed beyond noise', value: (r) => str(r.what_changed) },
      ],
      rows: ranks, sort: { key: 'dpeak', dir: 'desc' }, pageSize: 50, rowAttrs: (r) => ({ dataset: { rank: num(r.rank, 0), changed: r.changed ? 1 : 0 } }),
    }).el);
    main.append(rc.el);
    M.ready({ ranks: ranks.length, changed: num(D.ranks_changed, 0), sites: arr(D.sites).length });
  }

  // Both runs' batches, one row above the other, aligned by batch: each batch's peak (bar) and
  // low point (the darker part).
  function batchRows(batches) {
    const wrap = h('div', { class: 'canvas-wrap' });
    const canvas = h('canvas', { 'aria-label': 'batches, base above new' });
    wrap.append(canvas);
    const list = arr(batches).map(obj);
    function draw() {
      const W = Math.max(320, wrap.clientWidth || 900), row = 110, H = 2 * row + 30, L = 64;
      const ctx = M.setupCanvas(canvas, W, H);
      const max = Math.max(1, ...list.map((b) => Math.max(...pair(b.peak))));
      const n = Math.max(1, list.length), slot = (W - L) / n;
      ctx.font = '11px ' + M.cssVar('--sans');
      [['base', 0, BASE], ['new', 1, NEW]].forEach(([name, side, colour]) => {
        const top = side * (row + 14) + 4;
        ctx.fillStyle = M.cssVar('--muted');
        ctx.fillText(name, 2, top + 12);
        ctx.fillText(fmtBytes(max), 2, top + 26);
        list.forEach((b, i) => {
          const peak = pair(b.peak)[side], low = pair(b.low)[side];
          const hp = (peak / max) * (row - 10), hl = (low / max) * (row - 10);
          const x0 = L + i * slot + slot * 0.1, w = Math.max(1, slot * 0.8);
          ctx.fillStyle = M.mix(colour, '#ffffff', 0.45);
          ctx.fillRect(x0, top + row - hp, w, hp);
          ctx.fillStyle = colour;
          ctx.fillRect(x0, top + row - hl, w, hl);
          const batch = arr(b.batch)[side];
          if (n <= 60 && typeof batch === 'number' && batch >= 0) { ctx.fillStyle = M.cssVar('--muted'); ctx.fillText(String(batch), x0, top + row + 11); }
        });
      });
      canvas.onmousemove = (ev) => {
        const r = canvas.getBoundingClientRect();
        const i = Math.floor((ev.clientX - r.left - L) / slot);
        if (i < 0 || i >= list.length) return M.hideTip();
        const b = list[i];
        M.tip(ev.clientX, ev.clientY, M.tipBody('batch ' + arr(b.batch).join(' / '), [
          ['peak', fmtBytes(pair(b.peak)[0]) + ' → ' + fmtBytes(pair(b.peak)[1])],
          ['low point', fmtBytes(pair(b.low)[0]) + ' → ' + fmtBytes(pair(b.low)[1])]]));
      };
      canvas.onmouseleave = M.hideTip;
    }
    M.onWidthChange(wrap, draw);
    draw();
    return h('div', { class: 'chart-block' }, h('div', { class: 'legend' }, 'each batch: its peak (light) and its low point (dark); base above, new below'), wrap);
  }

  function rankPage() {
    const r = obj(D.rank);
    const main = h('main');
    const who = D.windows_mode ? 'rank ' + num(r.rank, 0) + ' → rank ' + num(r.new_rank, 0) : 'rank ' + num(r.rank, 0);
    app.append(M.topbar('diff · ' + who + ' · ' + labelOf(D.base) + ' → ' + labelOf(D.new), [{ label: 'all ranks', href: 'index.html' }]));
    app.append(main);
    main.append(h('div', { class: 'page-head' }, h('h1', { id: 'headline' }, who + ': ' + (str(r.what_changed) || 'no change beyond noise'))));
    main.append(h('div', { class: 'stats' }, paired('peak allocated', r.peak_allocated), paired('peak reserved', r.peak_reserved),
      paired('persistent', r.persistent), paired('held at the end', r.live_at_close), paired('fragmentation at the peak', r.fragmentation),
      paired('kept a batch (leak)', r.kept_per_batch, arr(r.kept_site).filter(Boolean).join(' → ') || 'none')));
    const tc = M.card('Batches, base above new', { id: 'batches' });
    tc.body.append(batchRows(r.batches));
    tc.body.append(noiseNote());
    main.append(tc.el);
    const fg = M.card('Bytes at the peak by stack, base against new', { id: 'flame', hint: 'a differential flame graph: width the larger of base and new, grew in red, shrank in blue; click to zoom' });
    const sites = arr(r.sites).map(obj);
    if (typeof M.drawIcicle === 'function' && r.stacks && typeof r.stacks === 'object') {
      const box = h('div', { class: 'chart-block', id: 'flame-graph' });
      fg.body.append(box);
      main.append(fg.el);
      M.drawIcicle(box, r.stacks, { delta: true, categories: CATEGORIES, colors: M.categoryColors(CATEGORIES),
        rootName: 'all bytes at the peak', shareLabel: 'of the larger peak' });
    } else {
      // Without the flame graph renderer: the sites' bars, base against new.
      const max = Math.max(1, ...sites.map((s) => Math.max(...pair(s.bytes))));
      const bars = h('div', { class: 'chart-block' });
      for (const s of sites.slice(0, 15)) {
        const [b, n] = pair(s.bytes), d = n - b;
        bars.append(h('div', { class: 'share', style: 'margin:2px 0', dataset: { site: str(s.key) } },
          h('span', { style: 'display:inline-block;height:10px;width:' + (Math.max(b, n) / max * 300).toFixed(0) + 'px;background:' + (d > 0 ? GROW : d < 0 ? SHRINK : BASE) }),
          h('span', { class: 'mono' }, siteName(s) + ' ' + fmtBytes(b) + ' → ' + fmtBytes(n) + ' (' + fmtSignedBytes(d) + ')')));
      }
      fg.body.append(bars);
      main.append(fg.el);
    }
    const sc = M.card('Sites at the peak', { id: 'sites', flush: true });
    sc.body.append(sitesTable(r.sites, false));
    main.append(sc.el);
    const cc = M.card('Categories at the peak', { id: 'categories', flush: true });
    cc.body.append(categoriesTable(r.categories));
    main.append(cc.el);
    M.ready({ rank: num(r.rank, 0), batches: arr(r.batches).length, flame: typeof M.drawIcicle === 'function' && !!r.stacks ? 1 : 0 });
  }

  M.safely('diff page', () => (document.body.classList.contains('page-diff-rank') ? rankPage() : crossPage()));
})();
