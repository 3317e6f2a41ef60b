// memsnap report: the cross-rank page. Findings first, then per-rank charts that share one rank
// axis (imbalance bars, rank x batch heatmap, bytes by category), the sites where ranks differ,
// and the table of ranks with per-window sparklines on demand. Scales to thousands of ranks:
// charts are canvases whose bars turn into a dense strip, tables paginate.
'use strict';

(function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtExactBytes, fmtInt, fmtPct } = M;
  const D = M.readData();
  const app = document.getElementById('app');

  // ---- model ---------------------------------------------------------------------------------
  const ranks = arr(D.ranks).map((r0) => {
    const r = obj(r0);
    const windows = arr(r.windows).map(obj).sort((a, b) => num(a.batch, 0) - num(b.batch, 0));
    const maxOf = (k) => {
      const m = windows.reduce((acc, w) => (isFinite(num(w[k])) ? Math.max(acc, num(w[k])) : acc), -Infinity);
      return m === -Infinity ? NaN : m;
    };
    return {
      rank: num(r.rank, NaN), status: str(r.status, 'unknown'), host: str(r.host), device: str(r.device), windows,
      peak: maxOf('peak_allocated'), reserved: maxOf('peak_reserved'), persistent: maxOf('persistent'),
      oom: windows.some((w) => w.oom === true),
    };
  }).sort((a, b) => (isFinite(a.rank) ? a.rank : 1e12) - (isFinite(b.rank) ? b.rank : 1e12));
  ranks.forEach((r, i) => { r.i = i; if (!isFinite(r.rank)) r.rank = i; });
  const nR = ranks.length;
  const byRank = new Map(ranks.map((r) => [r.rank, r]));
  const imb = obj(D.imbalance);
  const zscores = arr(imb.zscores);
  const outliers = new Set(arr(imb.outlier_ranks).map((x) => num(x)));
  const findings = arr(D.findings).map(obj);
  const findingsByRank = new Map();
  for (const f of findings) findingsByRank.set(num(f.rank, -1), (findingsByRank.get(num(f.rank, -1)) || 0) + 1);
  const batchSet = new Set();
  for (const r of ranks) for (const w of r.windows) if (isFinite(num(w.batch))) batchSet.add(num(w.batch));
  const batchList = Array.from(batchSet).sort((a, b) => a - b);
  const runName = str(D.run_name, 'unnamed run');
  const worldSize = num(D.world_size, nR);
  const windowPage = (r, batch) => {
    const w = r && r.windows.find((x) => num(x.batch) === batch);
    return w ? M.safeHref(w.page) : null;
  };
  const firstPage = (r) => { for (const w of (r ? r.windows : [])) { const p = M.safeHref(w.page); if (p) return p; } return null; };

  function median(values) {
    const v = values.filter((x) => isFinite(x)).sort((a, b) => a - b);
    if (!v.length) return NaN;
    const m = v.length >> 1;
    return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  }
  function stats(values) {
    const v = values.filter((x) => isFinite(x));
    const med = median(v);
    const max = v.length ? Math.max(...v) : NaN, min = v.length ? Math.min(...v) : NaN;
    const mean = v.reduce((a, b) => a + b, 0) / Math.max(1, v.length);
    const sd = Math.sqrt(v.reduce((a, b) => a + (b - mean) * (b - mean), 0) / Math.max(1, v.length));
    return { med, max, min, mean, sd, spread: max - min };
  }

  // ---- header --------------------------------------------------------------------------------
  app.append(M.topbar(runName + ' · all ranks', [
    { label: 'Findings', href: '#findings' }, { label: 'Imbalance', href: '#imbalance' }, { label: 'Heatmap', href: '#heatmap' },
    { label: 'Categories', href: '#categories' }, { label: 'Where ranks differ', href: '#differ' }, { label: 'Ranks', href: '#ranks' },
  ]));
  const main = h('main');
  app.append(main);
  const statusCounts = new Map();
  for (const r of ranks) statusCounts.set(r.status, (statusCounts.get(r.status) || 0) + 1);
  const head = h('div', { class: 'page-head' },
    h('h1', null, runName),
    h('div', { class: 'sub' },
      h('span', null, h('b', null, fmtInt(worldSize)), ' ranks'),
      h('span', null, h('b', null, fmtInt(batchList.length)), ' windows'),
      D.created ? h('span', null, 'recorded ', h('b', null, str(D.created))) : null),
    h('div', { class: 'badges' }, ...Array.from(statusCounts).map(([s, n]) => {
      const b = M.statusBadge(s);
      b.textContent = n + ' ' + s;
      return b;
    }), ranks.some((r) => r.oom) ? h('span', { class: 'badge solid-bad' }, 'OOM on ' + ranks.filter((r) => r.oom).length + ' rank(s)') : null));
  main.append(head);
  const peakStats = stats(ranks.map((r) => r.peak));
  const ratio = num(imb.max_over_median, peakStats.med > 0 ? peakStats.max / peakStats.med : NaN);
  main.append(h('div', { class: 'stats' },
    M.statTile('Largest peak allocated', fmtBytes(num(imb.max, peakStats.max)), 'median ' + fmtBytes(num(imb.median, peakStats.med))),
    M.statTile('Max / median', isFinite(ratio) ? ratio.toFixed(2) + '×' : '–', 'spread ' + fmtBytes(num(imb.spread, peakStats.spread)), ratio > 1.2 ? 'warn' : null),
    M.statTile('Outlier ranks', fmtInt(outliers.size), outliers.size ? Array.from(outliers).slice(0, 8).join(', ') + (outliers.size > 8 ? ' …' : '') : 'none', outliers.size ? 'warn' : null),
    M.statTile('Findings', fmtInt(findings.length), findings.length ? Array.from(new Set(findings.map((f) => str(f.kind)))).join(', ') : 'all ranks alike', findings.length ? 'bad' : null),
    M.statTile('Largest peak reserved', fmtBytes(stats(ranks.map((r) => r.reserved)).max), null)));

  // ---- findings ------------------------------------------------------------------------------
  const KIND_LABEL = { leak: 'leak', shard_imbalance: 'shard imbalance', spike: 'spike', oom: 'OOM', missing: 'missing', truncated: 'truncated' };
  function headline(f) {
    const r = 'Rank ' + str(f.rank, '?');
    const bytes = isFinite(num(f.bytes)) && num(f.bytes) !== 0 ? fmtBytes(num(f.bytes)) : null;
    const inBatch = f.batch != null ? ' in batch ' + str(f.batch) : '';
    const at = f.site ? ' at ' : '';
    switch (str(f.kind)) {
      case 'leak': return [r + ' leaks ' + (bytes || 'memory') + ' per batch' + at, f.site ? h('code', null, str(f.site)) : null];
      case 'shard_imbalance': return [r + ' holds ' + (bytes ? bytes + ' more than the median rank' : 'an uneven shard') + inBatch + at, f.site ? h('code', null, str(f.site)) : null];
      case 'spike': return [r + ' spikes by ' + (bytes || '?') + inBatch + at, f.site ? h('code', null, str(f.site)) : null];
      case 'oom': return [r + ' ran out of memory' + inBatch + (bytes ? ' (request of ' + bytes + ')' : '')];
      case 'missing': return [r + ' has no record' + inBatch];
      case 'truncated': return [r + '\u2019s record is truncated' + inBatch];
      default: return [r + ': ' + str(f.kind, 'finding') + (bytes ? ' (' + bytes + ')' : '') + inBatch];
    }
  }
  // Three or more findings of one kind at one site (and batch) are one row: a leak in the code
  // every rank runs is one row at 1,000 ranks, not 1,000. The row lists its ranks; each stays
  // one finding in summary.json.
  const GROUP_MIN = 3;
  function groupFindings(list) {
    const keyOf = (f) => str(f.kind) + '\u0000' + str(f.site) + '\u0000' + str(f.batch);
    const byKey = new Map();
    for (const f of list) {
      const key = keyOf(f);
      if (!byKey.has(key)) byKey.set(key, []);
      byKey.get(key).push(f);
    }
    const out = [];
    const placed = new Set();
    for (const f of list) {
      const key = keyOf(f);
      const members = byKey.get(key);
      if (members.length < GROUP_MIN) { out.push(f); continue; }
      if (placed.has(key)) continue;
      placed.add(key);
      out.push({ group: true, kind: f.kind, site: f.site, batch: f.batch, members });
    }
    return out;
  }
  // "0–3, 7, 9–12": sorted ranks as runs, at most `max` runs shown.
  function rankRuns(ranks, max) {
    const sorted = ranks.slice().sort((a, b) => a - b);
    const runs = [];
    for (const r of sorted) {
      const last = runs[runs.length - 1];
      if (last && r === last[1] + 1) last[1] = r; else runs.push([r, r]);
    }
    const text = runs.slice(0, max).map(([a, b]) => (a === b ? String(a) : a + '\u2013' + b)).join(', ');
    return runs.length > max ? text + ', \u2026' : text;
  }
  function groupRow(g) {
    const ranks = g.members.map((m) => num(m.rank));
    const bytes = g.members.map((m) => num(m.bytes)).filter((b) => isFinite(b) && b !== 0);
    const lo = bytes.length ? Math.min(...bytes) : 0, hi = bytes.length ? Math.max(...bytes) : 0;
    const amount = !bytes.length ? null : lo === hi ? fmtBytes(lo) : fmtBytes(lo) + '\u2013' + fmtBytes(hi);
    const first = g.members[0];
    const who = g.members.length + ' ranks (' + rankRuns(ranks, 8) + ')';
    const at = g.site ? ' at ' : '';
    const inBatch = g.batch != null ? ' in batch ' + str(g.batch) : '';
    let text;
    switch (str(g.kind)) {
      case 'leak': text = who + ' each leak ' + (amount || 'memory') + ' per batch' + at; break;
      case 'shard_imbalance': text = who + ' each hold ' + (amount ? amount + ' more than the median rank' : 'an uneven shard') + at; break;
      case 'spike': text = who + ' each spike by ' + (amount || '?') + inBatch + at; break;
      case 'oom': text = who + ' ran out of memory' + inBatch; break;
      case 'missing': text = who + ' have no record'; break;
      case 'truncated': text = who + ' have truncated records'; break;
      default: text = who + ': ' + str(g.kind, 'finding') + inBatch + at;
    }
    const each = h('details', { class: 'group-ranks' }, h('summary', null, 'each rank'));
    each.addEventListener('toggle', () => {
      if (!each.open || each.dataset.filled) return;
      each.dataset.filled = '1';
      const ul = h('ul', { class: 'group-members' });
      for (const m of g.members) {
        const r = byRank.get(num(m.rank));
        const page = (m.batch != null ? windowPage(r, num(m.batch)) : null) || firstPage(r);
        ul.append(h('li', null, page ? h('a', { href: page + '#' + M.findingAnchor(m) }, 'rank ' + str(m.rank)) : 'rank ' + str(m.rank),
          isFinite(num(m.bytes)) && num(m.bytes) !== 0 ? ' ' + fmtBytes(num(m.bytes)) : ''));
      }
      each.append(ul);
    });
    return h('li', { class: 'finding group', dataset: { kind: str(g.kind), ranks: String(g.members.length) } },
      h('div', null, h('span', { class: 'badge kind-' + str(g.kind) }, KIND_LABEL[str(g.kind)] || str(g.kind, '?'))),
      h('div', null, h('div', { class: 'headline' }, text, g.site ? h('code', null, str(g.site)) : null),
        first.detail ? h('div', { class: 'detail' }, str(first.detail) + ' (the first of them; each rank\u2019s own below)') : null, each),
      h('div', { class: 'actions' }));
  }
  const fc = M.card('Findings', { id: 'findings', hint: 'a finding names one rank and what is wrong with it; three or more alike are one row' });
  main.append(fc.el);
  fc.body.classList.add('flush');
  let kindFilter = null;
  let findingsShown = 40;
  const chips = h('div', { class: 'chips' });
  const flist = h('ul', { class: 'findings' });
  const fmore = h('div', { class: 'pager' });
  function drawFindings() {
    M.clear(chips); M.clear(flist); M.clear(fmore);
    const kinds = new Map();
    for (const f of findings) kinds.set(str(f.kind), (kinds.get(str(f.kind)) || 0) + 1);
    if (kinds.size > 1) {
      chips.append(h('button', { class: 'chip' + (kindFilter ? '' : ' on'), onclick: () => { kindFilter = null; drawFindings(); } }, 'all ' + findings.length));
      for (const [k, n] of kinds) chips.append(h('button', { class: 'chip badge kind-' + k + (kindFilter === k ? ' on' : ''), onclick: () => { kindFilter = kindFilter === k ? null : k; drawFindings(); } }, (KIND_LABEL[k] || k) + ' ' + n));
    }
    const list = groupFindings(findings.filter((f) => !kindFilter || str(f.kind) === kindFilter));
    for (const f of list.slice(0, findingsShown)) {
      if (f.group) {
        flist.append(groupRow(f));
        continue;
      }
      const r = byRank.get(num(f.rank));
      const page = (f.batch != null ? windowPage(r, num(f.batch)) : null) || firstPage(r);
      flist.append(h('li', { class: 'finding', dataset: { kind: str(f.kind), rank: str(f.rank) } },
        h('div', null, h('span', { class: 'badge kind-' + str(f.kind) }, KIND_LABEL[str(f.kind)] || str(f.kind, '?'))),
        h('div', null, h('div', { class: 'headline' }, ...headline(f)), f.detail ? h('div', { class: 'detail' }, str(f.detail)) : null),
        h('div', { class: 'actions' },
          r ? h('a', { href: '#ranks', onclick: (ev) => { ev.preventDefault(); selectRank(r.i, true); } }, 'show rank') : null,
          // The rank page opens with this finding shown: its batch marked, its allocations highlighted.
          page ? h('a', { href: page + '#' + M.findingAnchor(f), class: 'open-page' }, 'open page →') : null)));
    }
    if (list.length > findingsShown) fmore.append(h('span', null, 'showing ' + findingsShown + ' of ' + list.length + ' rows'), h('button', { onclick: () => { findingsShown = list.length; drawFindings(); } }, 'Show all'));
    fc.el.dataset.findings = String(findings.length);
  }
  if (findings.length === 0) {
    fc.body.append(h('div', { class: 'all-clear' }, h('span', { class: 'badge ok' }, '✓'), 'No findings: every rank behaves like the others.'));
  } else {
    fc.body.append(h('div', { class: 'table-tools' }, chips), flist, fmore);
    drawFindings();
  }

  // ---- shared rank axis ----------------------------------------------------------------------
  const PAD = { l: 70, r: 16 };
  let selected = -1, hoverIdx = -1;
  const charts = [];
  function axis(width) {
    const fullW = width - PAD.l - PAD.r;
    // Few ranks: bars keep a readable width and the group is centred; many: a dense strip.
    const bw = Math.min(72, fullW / Math.max(1, nR));
    const plotW = bw * Math.max(1, nR);
    const left = PAD.l + (fullW - plotW) / 2;
    return {
      plotW, bw, left,
      x: (i) => left + i * bw,
      index: (x) => { const i = Math.floor((x - left) / bw); return i >= 0 && i < nR ? i : -1; },
      dense: bw < 4,
    };
  }
  function drawRankTicks(c, ax, y) {
    c.fillStyle = M.cssVar('--muted'); c.font = '10.5px ' + M.cssVar('--sans'); c.textAlign = 'center'; c.textBaseline = 'top';
    const every = Math.max(1, Math.ceil(34 / ax.bw));
    const step = every <= 1 ? 1 : M.niceStep(every);
    for (let i = 0; i < nR; i += step) c.fillText(String(ranks[i].rank), ax.x(i) + ax.bw / 2, y);
  }
  function drawSelection(c, ax, top, height) {
    for (const [idx, alpha] of [[hoverIdx, 0.10], [selected, 0.22]]) {
      if (idx < 0) continue;
      c.fillStyle = M.cssVar('--accent');
      c.globalAlpha = alpha;
      c.fillRect(ax.x(idx) - (ax.dense ? 1 : 0), top, Math.max(2, ax.bw + (ax.dense ? 2 : 0)), height);
      c.globalAlpha = 1;
    }
  }
  function chartCanvas(heightFn, drawFn, hitFn, clickFn, label) {
    const canvas = h('canvas', { class: 'interactive', 'aria-label': label });
    const wrap = h('div', { class: 'canvas-wrap' }, canvas);
    const ch = { canvas, wrap, width: 800, ctx: null, ax: null };
    ch.draw = () => {
      ch.width = Math.max(360, wrap.clientWidth || 800);
      ch.ctx = M.setupCanvas(canvas, ch.width, heightFn());
      ch.ax = axis(ch.width);
      drawFn(ch.ctx, ch.ax, ch.width);
    };
    canvas.addEventListener('mousemove', (ev) => {
      const r = canvas.getBoundingClientRect();
      const x = ev.clientX - r.left, y = ev.clientY - r.top;
      const i = ch.ax ? ch.ax.index(x) : -1;
      const hit = i >= 0 ? hitFn(i, x, y) : null;
      if (hit) { M.tip(ev.clientX, ev.clientY, hit); canvas.classList.add('clickable'); } else { M.hideTip(); canvas.classList.remove('clickable'); }
      if (i !== hoverIdx) { hoverIdx = i; redrawCharts(); }
    });
    canvas.addEventListener('mouseleave', () => { M.hideTip(); hoverIdx = -1; redrawCharts(); });
    canvas.addEventListener('click', (ev) => {
      const r = canvas.getBoundingClientRect();
      const i = ch.ax ? ch.ax.index(ev.clientX - r.left) : -1;
      if (i >= 0) clickFn(i, ev.clientX - r.left, ev.clientY - r.top);
    });
    charts.push(ch);
    return ch;
  }
  let redrawReq = 0;
  function redrawCharts() {
    if (redrawReq) return;
    redrawReq = requestAnimationFrame(() => { redrawReq = 0; for (const ch of charts) ch.draw(); });
  }

  // ---- imbalance bar charts ------------------------------------------------------------------
  const ic = M.card('Imbalance across ranks', { id: 'imbalance', hint: 'one bar per rank (max over its windows); outliers in red; click a bar for the rank' });
  main.append(ic.el);
  ic.body.classList.add('flush');
  const metrics = [
    { key: 'peak', label: 'Peak allocated', given: true },
    { key: 'reserved', label: 'Peak reserved' },
    { key: 'persistent', label: 'Persistent (live at window start and end)' },
  ];
  for (const m of metrics) {
    const values = ranks.map((r) => r[m.key]);
    const st = stats(values);
    // For the analysed metric, the analysis' own numbers win, so page and summary.json agree.
    if (m.given && isFinite(num(imb.median))) st.med = num(imb.median);
    m.values = values;
    m.st = st;
    m.z = (i) => (m.given && isFinite(num(zscores[ranks[i].rank])) ? num(zscores[ranks[i].rank]) : st.sd > 0 ? (values[i] - st.mean) / st.sd : 0);
    // One definition of an outlier on the whole page: the analysis' outlier ranks (the tile, the
    // rank table and every chart mark the same ranks).
    m.out = (i) => outliers.has(ranks[i].rank);
    const outList = ranks.filter((r) => m.out(r.i));
    const ratioM = m.given && isFinite(num(imb.max_over_median)) ? num(imb.max_over_median) : st.med > 0 ? st.max / st.med : NaN;
    const legend = h('div', { class: 'legend' },
      h('span', { class: 'item' }, 'max ', h('b', null, fmtBytes(st.max))),
      h('span', { class: 'item' }, h('span', { class: 'sw line', style: 'border-top-color:var(--accent)' }), 'median ', h('b', null, fmtBytes(st.med))),
      h('span', { class: 'item' }, 'max/median ', h('b', null, isFinite(ratioM) ? ratioM.toFixed(2) + '×' : '–')),
      h('span', { class: 'item' }, 'spread ', h('b', null, fmtBytes(m.given && isFinite(num(imb.spread)) ? num(imb.spread) : st.spread))),
      h('span', { class: 'item', title: 'the outlier ranks of the analysis (by peak allocated), marked alike on every chart' },
        h('span', { class: 'sw outlier' }), 'outliers ', h('b', null, outList.length ? outList.slice(0, 6).map((r) => r.rank + ' (z ' + m.z(r.i).toFixed(1) + ')').join(', ') + (outList.length > 6 ? ' …' : '') : 'none')));
    const block = h('div', { class: 'chart-block' }, h('div', { class: 'chart-title' }, h('h3', null, m.label), legend));
    ic.body.append(block);
    const HEIGHT = 150, top = 8, bottom = 20;
    const ch = chartCanvas(() => HEIGHT, (c, ax, width) => {
      const plotH = HEIGHT - top - bottom;
      const ymax = (isFinite(st.max) && st.max > 0 ? st.max : 1) * 1.08;
      const Y = (v) => top + plotH - (v / ymax) * plotH;
      c.clearRect(0, 0, width, HEIGHT);
      const ticks = M.byteTicks(ymax, 3);
      c.font = '10.5px ' + M.cssVar('--sans'); c.textAlign = 'right'; c.textBaseline = 'middle';
      c.canvas.dataset.yTicks = ticks.ticks.map(fmtBytes).join('|');
      for (const v of ticks.ticks) {
        const y = Math.round(Y(v)) + 0.5;
        c.strokeStyle = M.cssVar('--grid'); c.beginPath(); c.moveTo(PAD.l, y); c.lineTo(width - PAD.r, y); c.stroke();
        c.fillStyle = M.cssVar('--muted'); c.fillText(fmtBytes(v), PAD.l - 8, y);
      }
      drawSelection(c, ax, top, plotH);
      const normal = '#4e79a7', outc = M.cssVar('--bad'), missing = M.cssVar('--faint');
      const gap = ax.bw >= 6 ? Math.min(3, ax.bw * 0.2) : 0;
      for (let i = 0; i < nR; i++) {
        const v = values[i];
        const x0 = ax.dense ? Math.floor(ax.x(i)) : ax.x(i) + gap / 2;
        const w = ax.dense ? Math.max(1, Math.floor(ax.x(i + 1)) - Math.floor(ax.x(i))) : ax.bw - gap;
        if (!isFinite(v)) { c.fillStyle = missing; c.fillRect(x0, top + plotH - 3, w, 3); continue; }
        c.fillStyle = m.out(i) ? outc : normal;
        const y = Y(v);
        c.fillRect(x0, y, w, top + plotH - y);
      }
      // In a dense strip a 1-pixel red bar is easy to miss: mark outliers above the plot too.
      if (ax.dense) {
        c.fillStyle = outc;
        for (let i = 0; i < nR; i++) {
          if (!m.out(i) || !isFinite(values[i])) continue;
          const x = ax.x(i) + ax.bw / 2, y = Math.max(top + 6, Y(values[i]) - 3);
          c.beginPath(); c.moveTo(x - 4, y - 6); c.lineTo(x + 4, y - 6); c.lineTo(x, y); c.closePath(); c.fill();
        }
      }
      if (isFinite(st.med)) {
        const y = Math.round(Y(st.med)) + 0.5;
        c.strokeStyle = M.cssVar('--accent'); c.setLineDash([5, 3]); c.lineWidth = 1.25;
        c.beginPath(); c.moveTo(PAD.l, y); c.lineTo(width - PAD.r, y); c.stroke(); c.setLineDash([]); c.lineWidth = 1;
      }
      drawRankTicks(c, ax, top + plotH + 5);
    }, (i) => {
      const r = ranks[i];
      const v = values[i];
      return M.tipBody('Rank ' + r.rank + ' · ' + m.label.toLowerCase().split(' (')[0], [
        ['value', fmtBytes(v) + (isFinite(v) ? '  (' + fmtExactBytes(v) + ')' : '')],
        ['vs median', isFinite(v) && st.med > 0 ? (v / st.med).toFixed(2) + '×  (' + M.fmtSignedBytes(v - st.med) + ')' : '–'],
        ['z-score', isFinite(v) ? m.z(i).toFixed(2) : '–'],
        ['outlier', m.out(i) ? 'yes' : 'no'],
        ['host', r.host || '–'], ['status', r.status],
      ], h('div', { class: 'foot' }, 'click to show this rank'));
    }, (i) => selectRank(i, true), m.label + ' per rank');
    block.append(ch.wrap);
    ch.canvas.dataset.bars = String(nR);
    ch.canvas.dataset.metric = m.key;
    ch.canvas.dataset.outliers = String(outList.length);
  }

  // ---- heatmap: rank x batch, peak allocated -------------------------------------------------
  const hc = M.card('Peak allocated by rank and batch', { id: 'heatmap', hint: 'columns are ranks, rows windows; click a cell to open that page' });
  main.append(hc.el);
  const cellValues = [];
  for (const r of ranks) for (const w of r.windows) if (isFinite(num(w.peak_allocated))) cellValues.push(num(w.peak_allocated));
  // Colour domain: the 1st to 99th percentile plus a margin, so that one OOM or spike does not
  // flatten every other cell into one colour; cells beyond it take the end colours.
  const hmDomain = (() => {
    if (!cellValues.length) return { lo: 0, hi: 1, clipLo: false, clipHi: false };
    const v = cellValues.slice().sort((a, b) => a - b);
    const q = (f) => v[Math.min(v.length - 1, Math.max(0, Math.round(f * (v.length - 1))))];
    const med = q(0.5), min = v[0], max = v[v.length - 1];
    let lo = Math.max(min, q(0.01) - 0.05 * med), hi = Math.min(max, q(0.99) + 0.05 * med);
    if (v.length < 50) { lo = min; hi = max; }
    if (!(hi > lo)) { lo = min; hi = max > min ? max : min + 1; }
    return { lo, hi, clipLo: lo > min, clipHi: hi < max };
  })();
  const hmMin = hmDomain.lo, hmMax = hmDomain.hi;
  if (batchList.length === 0 || nR === 0) {
    hc.body.append(M.emptyNote('no windows recorded'));
  } else {
    const scale = h('canvas', { 'aria-label': 'colour scale' });
    hc.body.append(h('div', { class: 'legend', style: 'margin-bottom:6px' },
      h('span', { class: 'item', title: 'colour scale of peak allocated' }, (hmDomain.clipLo ? '≤ ' : '') + fmtBytes(hmMin), scale, (hmDomain.clipHi ? '≥ ' : '') + fmtBytes(hmMax)),
      h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:var(--bg);border:1px solid var(--line)' }), 'no window'),
      h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:transparent;border:2px solid var(--bad)' }), 'OOM')));
    const sc = M.setupCanvas(scale, 160, 10);
    for (let x = 0; x < 160; x++) { sc.fillStyle = M.ramp(x / 159); sc.fillRect(x, 0, 1, 10); }
    const nb = batchList.length;
    // A row is a window: named by the batches it spans, so a finding's batch (a spike in batch 4)
    // is found in the row "batches 3–5", not under its last batch alone.
    const rowStart = batchList.map((b) => {
      let lo = b;
      for (const r of ranks) for (const w of r.windows) if (num(w.batch) === b && isFinite(num(w.batch_start))) lo = Math.min(lo, num(w.batch_start));
      return lo;
    });
    const rowLabel = (row) => (rowStart[row] === batchList[row] ? 'batch ' + batchList[row] : 'batches ' + rowStart[row] + '\u2013' + batchList[row]);
    const cellFindings = (r, w) => findings.filter((f) => num(f.rank) === r.rank && f.batch != null &&
      num(f.batch) >= num(w.batch_start, num(w.batch)) && num(f.batch) <= num(w.batch));
    const rowH = Math.max(4, Math.min(24, Math.floor(360 / nb)));
    const top = 4, bottom = 20;
    const HEIGHT = top + nb * rowH + bottom;
    const cellOf = (i, y) => {
      const row = Math.floor((y - top) / rowH);
      if (row < 0 || row >= nb) return null;
      const batch = batchList[row];
      const w = ranks[i].windows.find((x) => num(x.batch) === batch);
      return { row, batch, w };
    };
    const ch = chartCanvas(() => HEIGHT, (c, ax, width) => {
      c.clearRect(0, 0, width, HEIGHT);
      c.fillStyle = M.cssVar('--bg'); c.fillRect(ax.left, top, ax.plotW, nb * rowH);
      const span = Math.max(1, hmMax - hmMin);
      for (let i = 0; i < nR; i++) {
        const r = ranks[i];
        const x0 = Math.floor(ax.x(i)), w = Math.max(1, Math.floor(ax.x(i + 1)) - x0 - (ax.bw > 8 ? 1 : 0));
        for (const win of r.windows) {
          const row = batchList.indexOf(num(win.batch));
          if (row < 0) continue;
          const v = num(win.peak_allocated);
          c.fillStyle = isFinite(v) ? M.ramp((v - hmMin) / span) : M.cssVar('--faint');
          c.fillRect(x0, top + row * rowH, w, rowH - (rowH > 6 ? 1 : 0));
          if (win.oom) {
            c.strokeStyle = M.cssVar('--bad'); c.lineWidth = 2;
            c.strokeRect(x0 + 1, top + row * rowH + 1, Math.max(1, w - 2), rowH - 3);
            c.lineWidth = 1;
          }
        }
      }
      c.fillStyle = M.cssVar('--muted'); c.font = '10.5px ' + M.cssVar('--sans'); c.textAlign = 'right'; c.textBaseline = 'middle';
      const labelEvery = Math.max(1, Math.ceil(13 / rowH));
      batchList.forEach((b, row) => { if (row % labelEvery === 0) c.fillText(rowLabel(row), ax.left - 8, top + row * rowH + rowH / 2); });
      drawSelection(c, ax, top, nb * rowH);
      drawRankTicks(c, ax, top + nb * rowH + 5);
    }, (i, x, y) => {
      const cell = cellOf(i, y);
      if (!cell) return null;
      const r = ranks[i];
      if (!cell.w) return M.tipBody('Rank ' + r.rank + ' · ' + rowLabel(cell.row), [['window', 'none recorded'], ['status', r.status]]);
      const w = cell.w;
      const here = cellFindings(r, w);
      return M.tipBody('Rank ' + r.rank + ' · ' + rowLabel(cell.row), [
        ...here.map((f) => [M.KIND_LABEL[str(f.kind)] || str(f.kind), 'in batch ' + str(f.batch) + (isFinite(num(f.bytes)) && num(f.bytes) > 0 ? ' · ' + fmtBytes(num(f.bytes)) : '')]),
        ['peak allocated', fmtBytes(num(w.peak_allocated))], ['peak reserved', fmtBytes(num(w.peak_reserved))],
        ['live at open', fmtBytes(num(w.live_at_open))], ['live at close', fmtBytes(num(w.live_at_close))],
        ['persistent', fmtBytes(num(w.persistent))], ['batches', str(w.batch_start, '?') + '–' + str(w.batch, '?')],
        ['status', str(w.status, r.status) + (w.oom ? ' · OOM' : '')],
      ], h('div', { class: 'foot' }, M.safeHref(w.page) ? 'click to open this window' : 'no page for this window'));
    }, (i, x, y) => {
      const cell = cellOf(i, y);
      const href = cell && cell.w ? M.safeHref(cell.w.page) : null;
      const first = cell && cell.w ? cellFindings(ranks[i], cell.w)[0] : null;
      if (href) window.location.href = href + (first ? '#' + M.findingAnchor(first) : '');
      else selectRank(i, true);
    }, 'peak allocated per rank and batch');
    hc.body.append(ch.wrap);
    ch.canvas.dataset.cells = String(cellValues.length);
    ch.canvas.dataset.rows = batchList.map((_, row) => rowLabel(row)).join('|');
  }

  // ---- bytes by category per rank ------------------------------------------------------------
  const C = obj(D.categories);
  const catNames = arr(C.names).map((x) => str(x, '?'));
  const catBytes = arr(C.bytes_by_rank);
  const catColors = M.categoryColors(catNames);
  const cc = M.card('Bytes at peak by category', { id: 'categories', hint: 'what each rank holds at its peak (FSDP: parameters, gradients, optimizer state, gathers, activations)' });
  main.append(cc.el);
  if (catNames.length === 0 || catBytes.length === 0) {
    cc.body.append(M.emptyNote('no category breakdown recorded'));
  } else {
    let catHL = -1;
    const legend = h('div', { class: 'legend', style: 'margin-bottom:6px' });
    const totals = catNames.map((_, k) => catBytes.reduce((a, row) => a + num(arr(row)[k], 0), 0));
    const drawLegend = () => {
      M.clear(legend);
      catNames.forEach((n, k) => legend.append(h('span', { class: 'item clickable' + (catHL >= 0 && catHL !== k ? ' dim' : ''), onclick: () => { catHL = catHL === k ? -1 : k; drawLegend(); redrawCharts(); } },
        h('span', { class: 'sw', style: 'background:' + catColors[k] }), n, h('b', null, fmtBytes(totals[k] / Math.max(1, catBytes.length)) + ' avg'))));
    };
    drawLegend();
    cc.body.append(legend);
    const rowFor = (i) => arr(catBytes[ranks[i].rank] !== undefined ? catBytes[ranks[i].rank] : catBytes[i]);
    let ymax = 1;
    for (let i = 0; i < nR; i++) ymax = Math.max(ymax, rowFor(i).reduce((a, v) => a + Math.max(0, num(v, 0)), 0));
    ymax *= 1.06;
    const HEIGHT = 190, top = 8, bottom = 20;
    const ch = chartCanvas(() => HEIGHT, (c, ax, width) => {
      const plotH = HEIGHT - top - bottom;
      const Y = (v) => top + plotH - (v / ymax) * plotH;
      c.clearRect(0, 0, width, HEIGHT);
      c.font = '10.5px ' + M.cssVar('--sans'); c.textAlign = 'right'; c.textBaseline = 'middle';
      for (const v of M.byteTicks(ymax, 4).ticks) {
        const y = Math.round(Y(v)) + 0.5;
        c.strokeStyle = M.cssVar('--grid'); c.beginPath(); c.moveTo(PAD.l, y); c.lineTo(width - PAD.r, y); c.stroke();
        c.fillStyle = M.cssVar('--muted'); c.fillText(fmtBytes(v), PAD.l - 8, y);
      }
      drawSelection(c, ax, top, plotH);
      const gap = ax.bw >= 6 ? Math.min(3, ax.bw * 0.2) : 0;
      for (let i = 0; i < nR; i++) {
        const row = rowFor(i);
        const x0 = ax.dense ? Math.floor(ax.x(i)) : ax.x(i) + gap / 2;
        const w = ax.dense ? Math.max(1, Math.floor(ax.x(i + 1)) - Math.floor(ax.x(i))) : ax.bw - gap;
        let acc = 0;
        for (let k = 0; k < catNames.length; k++) {
          const v = Math.max(0, num(row[k], 0));
          if (!v) continue;
          const y0 = Y(acc), y1 = Y(acc + v);
          c.globalAlpha = catHL >= 0 && catHL !== k ? 0.2 : 1;
          c.fillStyle = catColors[k];
          c.fillRect(x0, y1, w, y0 - y1);
          acc += v;
        }
        c.globalAlpha = 1;
      }
      drawRankTicks(c, ax, top + plotH + 5);
    }, (i) => {
      const row = rowFor(i);
      const total = row.reduce((a, v) => a + Math.max(0, num(v, 0)), 0);
      return M.tipBody('Rank ' + ranks[i].rank + ' · ' + fmtBytes(total) + ' at peak',
        catNames.map((n, k) => [n, fmtBytes(num(row[k], 0)) + '  ' + fmtPct(num(row[k], 0) / Math.max(1, total))]));
    }, (i) => selectRank(i, true), 'bytes at peak by category per rank');
    cc.body.append(ch.wrap);
  }

  // ---- where ranks differ --------------------------------------------------------------------
  const diffs = arr(D.site_diffs).map((d, k) => Object.assign({ k }, obj(d)));
  const dc = M.card('Where ranks differ', { id: 'differ', hint: 'allocation sites whose bytes at the peak differ most across ranks' });
  main.append(dc.el);
  dc.body.classList.add('flush');
  function miniStrip(values, maxRank, minRank) {
    const W = 220, H = 30;
    const cv = h('canvas', { class: 'mini', 'aria-label': 'bytes per rank' });
    const c = M.setupCanvas(cv, W, H);
    const n = values.length;
    let m = 0;
    for (const v of values) m = Math.max(m, num(v, 0));
    if (!(m > 0)) m = 1;
    const bw = W / Math.max(1, n);
    c.fillStyle = M.cssVar('--grid'); c.fillRect(0, H - 1, W, 1);
    const bad = M.cssVar('--bad'), plain = M.mix('#4e79a7', '#ffffff', 0.45);
    for (let i = 0; i < n; i++) {
      const v = Math.max(0, num(values[i], 0));
      const hgt = Math.max(v > 0 ? 1 : 0, (v / m) * (H - 2));
      c.fillStyle = i === maxRank ? bad : i === minRank ? '#4e79a7' : plain;
      c.fillRect(Math.floor(i * bw), H - 1 - hgt, Math.max(1, Math.floor((i + 1) * bw) - Math.floor(i * bw) - (bw > 5 ? 1 : 0)), hgt);
    }
    cv.addEventListener('mousemove', (ev) => {
      const r = cv.getBoundingClientRect();
      const i = Math.floor((ev.clientX - r.left) / bw);
      if (i < 0 || i >= n) return;
      M.tip(ev.clientX, ev.clientY, M.tipBody('Rank ' + i, [['bytes', fmtBytes(num(values[i], 0))]]));
    });
    cv.addEventListener('mouseleave', () => M.hideTip());
    return cv;
  }
  if (diffs.length === 0) {
    dc.body.append(M.emptyNote('no per-site differences recorded'));
  } else {
    const table = M.dataTable({
      rows: diffs,
      pageSize: 20,
      sort: { key: 'delta', dir: 'desc' },
      filterText: (d) => str(d.site) + ' ' + str(d.category),
      filterPlaceholder: 'Filter sites…',
      rowAttrs: (d) => ({ class: 'diff-row', dataset: { maxRank: str(d.max_rank), delta: num(d.delta, 0) } }),
      columns: [
        { key: 'site', label: 'Site', value: (d) => str(d.site).toLowerCase(), render: (d) => h('span', { class: 'site' }, str(d.site) || (arr(d.stack)[0] ? str(obj(arr(d.stack)[0]).name) : '(unknown site)')) },
        { key: 'category', label: 'Category', value: (d) => str(d.category), render: (d) => {
          const k = catNames.indexOf(str(d.category));
          return h('span', { class: 'legend' }, h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:' + (k >= 0 ? catColors[k] : M.categoryColors([str(d.category)])[0]) }), str(d.category, '–')));
        } },
        { key: 'delta', label: 'Max − min', num: true, value: (d) => num(d.delta, 0), render: (d) => h('b', null, fmtBytes(num(d.delta))) },
        { key: 'max', label: 'Most on', num: true, value: (d) => num(d.max_rank, 0), render: (d) => h('span', { class: 'rank-mini' }, 'rank ' + str(d.max_rank, '?') + ' · ' + fmtBytes(num(arr(d.bytes_by_rank)[num(d.max_rank, -1)]))) },
        { key: 'min', label: 'Least on', num: true, value: (d) => num(d.min_rank, 0), render: (d) => h('span', { class: 'rank-mini' }, 'rank ' + str(d.min_rank, '?') + ' · ' + fmtBytes(num(arr(d.bytes_by_rank)[num(d.min_rank, -1)]))) },
        { key: 'median', label: 'Median', num: true, value: (d) => median(arr(d.bytes_by_rank).map((v) => num(v))), render: (d) => fmtBytes(median(arr(d.bytes_by_rank).map((v) => num(v)))) },
        { key: 'ranks', label: 'Bytes per rank', render: (d) => miniStrip(arr(d.bytes_by_rank), num(d.max_rank, -1), num(d.min_rank, -1)) },
      ],
      expand: (d) => {
        const v = arr(d.bytes_by_rank).map((x, i) => ({ i, v: num(x, 0) }));
        const med = median(v.map((x) => x.v));
        const top = v.slice().sort((a, b) => b.v - a.v).slice(0, 8);
        return h('div', { style: 'display:grid;grid-template-columns:minmax(0,1fr) 320px;gap:24px' },
          h('div', null, h('div', { style: 'font-weight:600;font-size:12.5px' }, 'Stack (innermost first)'), M.stackList(arr(d.stack).map(obj))),
          h('div', null, h('div', { style: 'font-weight:600;font-size:12.5px;margin-bottom:4px' }, 'Ranks holding the most'),
            M.kvList(top.map((x) => ['rank ' + x.i, fmtBytes(x.v) + (med > 0 ? '  (' + (x.v / med).toFixed(2) + '× median)' : '  (' + M.fmtSignedBytes(x.v - med) + ')')]))));
      },
    });
    dc.body.append(table.el);
  }

  // ---- ranks table with sparklines on demand -------------------------------------------------
  const rc = M.card('Ranks', { id: 'ranks', hint: 'click a row for its windows\u2019 timelines' });
  main.append(rc.el);
  rc.body.classList.add('flush');
  // A window's "spark": {"max": bytes, "levels": text}, two base64url characters a level (0..4095
  // of max, high six bits first), levels at equal steps of time over the window.
  const B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
  function sparkLevels(w) {
    const s = obj(w.spark), text = str(s.levels), max = num(s.max, 0);
    const out = [];
    for (let i = 0; i + 1 < text.length; i += 2) {
      const hi = B64.indexOf(text[i]), lo = B64.indexOf(text[i + 1]);
      out.push(hi < 0 || lo < 0 ? NaN : (((hi << 6) | lo) / 4095) * max);
    }
    return out;
  }
  function sparkline(w) {
    const vs = sparkLevels(w);
    const ts = vs.map((_, i) => (vs.length > 1 ? i / (vs.length - 1) : 0));
    const W = 260, H = 52;
    const cv = h('canvas', { class: 'sparkline', 'aria-label': 'allocated over the window' });
    const c = M.setupCanvas(cv, W, H);
    const n = Math.min(ts.length, vs.length);
    c.fillStyle = M.cssVar('--panel'); c.fillRect(0, 0, W, H);
    c.strokeStyle = M.cssVar('--line'); c.strokeRect(0.5, 0.5, W - 1, H - 1);
    if (n < 2) {
      c.fillStyle = M.cssVar('--faint'); c.font = '11px ' + M.cssVar('--sans'); c.textAlign = 'center'; c.textBaseline = 'middle';
      c.fillText('no timeline recorded', W / 2, H / 2);
      return cv;
    }
    let m = 0;
    for (let i = 0; i < n; i++) m = Math.max(m, num(vs[i], 0));
    const ref = Math.max(m, num(w.peak_reserved, 0), 1);
    const X = (t) => 2 + num(t, 0) * (W - 4), Y = (v) => H - 3 - (num(v, 0) / ref) * (H - 8);
    c.beginPath();
    c.moveTo(X(ts[0]), H - 2);
    for (let i = 0; i < n; i++) c.lineTo(X(ts[i]), Y(vs[i]));
    c.lineTo(X(ts[n - 1]), H - 2);
    c.closePath();
    c.fillStyle = w.oom ? M.mix('#d92d20', '#ffffff', 0.6) : M.mix('#4e79a7', '#ffffff', 0.55);
    c.fill();
    c.beginPath();
    for (let i = 0; i < n; i++) (i ? c.lineTo : c.moveTo).call(c, X(ts[i]), Y(vs[i]));
    c.strokeStyle = w.oom ? M.cssVar('--bad') : '#4e79a7'; c.lineWidth = 1.25; c.stroke();
    if (num(w.peak_reserved, 0) > 0) {
      const y = Math.round(Y(w.peak_reserved)) + 0.5;
      c.setLineDash([3, 2]); c.strokeStyle = M.cssVar('--reserved'); c.globalAlpha = 0.6; c.lineWidth = 1;
      c.beginPath(); c.moveTo(2, y); c.lineTo(W - 2, y); c.stroke(); c.setLineDash([]); c.globalAlpha = 1;
    }
    return cv;
  }
  const rankTable = M.dataTable({
    rows: ranks,
    pageSize: 50,
    sort: { key: 'rank', dir: 'asc' },
    filterText: (r) => 'rank ' + r.rank + ' ' + r.host + ' ' + r.device + ' ' + r.status,
    filterPlaceholder: 'Filter by rank, host, status…',
    rowAttrs: (r) => ({ class: 'rank-row' + (r.i === selected ? ' selected' : ''), dataset: { rank: r.rank } }),
    columns: [
      { key: 'rank', label: 'Rank', num: true, value: (r) => r.rank, render: (r) => h('b', null, String(r.rank)) },
      { key: 'status', label: 'Status', value: (r) => r.status, render: (r) => h('span', { class: 'badges' }, ...M.statusBadges(r.status, r.oom), outliers.has(r.rank) ? h('span', { class: 'badge warn' }, 'outlier') : null) },
      { key: 'host', label: 'Host', value: (r) => r.host, render: (r) => r.host || '–' },
      { key: 'device', label: 'Device', value: (r) => r.device, render: (r) => r.device || '–' },
      { key: 'windows', label: 'Windows', num: true, value: (r) => r.windows.length, render: (r) => fmtInt(r.windows.length) },
      { key: 'peak', label: 'Peak allocated', num: true, value: (r) => r.peak, render: (r) => fmtBytes(r.peak) },
      { key: 'reserved', label: 'Peak reserved', num: true, value: (r) => r.reserved, render: (r) => fmtBytes(r.reserved) },
      { key: 'persistent', label: 'Persistent', num: true, value: (r) => r.persistent, render: (r) => fmtBytes(r.persistent) },
      { key: 'z', label: 'z-score', num: true, title: 'z-score of peak allocated', value: (r) => num(zscores[r.rank]), render: (r) => (isFinite(num(zscores[r.rank])) ? num(zscores[r.rank]).toFixed(2) : '–') },
      { key: 'findings', label: 'Findings', num: true, value: (r) => findingsByRank.get(r.rank) || 0, render: (r) => (findingsByRank.get(r.rank) ? h('span', { class: 'badge bad' }, String(findingsByRank.get(r.rank))) : '') },
      { key: 'pages', label: 'Pages', render: (r) => {
        const wrap = h('span', { style: 'display:inline-flex;gap:8px;flex-wrap:wrap' });
        for (const w of r.windows.slice(0, 6)) { const p = M.safeHref(w.page); if (p) wrap.append(h('a', { href: p, title: 'batches ' + str(w.batch_start, '?') + '–' + str(w.batch, '?') }, 'b' + str(w.batch, '?'))); }
        if (r.windows.length > 6) wrap.append(h('span', { class: 'none' }, '+' + (r.windows.length - 6)));
        return wrap;
      } },
    ],
    expand: (r) => {
      if (!r.windows.length) return h('div', { class: 'none' }, 'no windows recorded for this rank');
      const grid = h('div', { class: 'spark-grid' });
      for (const w of r.windows) {
        const p = M.safeHref(w.page);
        grid.append(h('div', { class: 'spark' },
          h('span', null, h('b', null, 'batch ' + str(w.batch, '?')), ' · peak ' + fmtBytes(num(w.peak_allocated)) + (w.oom ? ' · OOM' : ''), p ? h('a', { href: p, style: 'margin-left:8px' }, 'open →') : null),
          sparkline(w)));
      }
      return grid;
    },
    onRowClick: (r) => { selected = r.i; redrawCharts(); },
  });
  rc.body.append(rankTable.el);
  function selectRank(i, reveal) {
    selected = i;
    redrawCharts();
    const row = rankTable.reveal((r) => r.i === i);
    if (reveal && row) row.scrollIntoView({ behavior: 'auto', block: 'center' });
  }

  // ---- go ------------------------------------------------------------------------------------
  for (const ch of charts) ch.draw();
  let lastW = main.clientWidth;
  if (typeof ResizeObserver !== 'undefined') new ResizeObserver(() => { if (main.clientWidth !== lastW) { lastW = main.clientWidth; redrawCharts(); } }).observe(main);
  M.ready({ ranks: nR, findings: findings.length });

  if (M.selftest) {
    const results = [];
    const check = (name, fn) => { let ok = false; try { ok = !!fn(); } catch (e) { results.push(name + '=error:' + e.message); return; } results.push(name + '=' + (ok ? 'ok' : 'fail')); };
    const fire = (el, type, x, y) => el.dispatchEvent(new MouseEvent(type, { bubbles: true, clientX: x, clientY: y }));
    check('page-2', () => { const b = rc.el.querySelector('.pager button:last-child'); if (nR <= 50) return true; b.click(); return rc.el.querySelector('tr.rank-row').dataset.rank === String(ranks[50].rank); });
    if (charts.length && nR) {
      const ch = charts[0];
      const r = ch.canvas.getBoundingClientRect();
      check('bar-hover', () => { fire(ch.canvas, 'mousemove', r.left + ch.ax.x(0) + ch.ax.bw / 2, r.top + r.height / 2); const t = document.querySelector('.tip'); return t && t.style.display === 'block' && t.textContent.includes('Rank ' + ranks[0].rank); });
      check('bar-click', () => { fire(ch.canvas, 'click', r.left + ch.ax.x(nR - 1) + ch.ax.bw / 2, r.top + r.height / 2); return !!rc.el.querySelector('tr.detail .spark-grid, tr.detail .none'); });
      check('sparkline', () => { const row = rc.el.querySelector('tr.rank-row'); row.click(); return rc.el.querySelectorAll('canvas.sparkline').length > 0; });
    }
    document.body.dataset.selftest = results.join(' ');
  }
})();
