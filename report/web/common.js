// memsnap report: helpers shared by the rank and cross-rank pages (formatting, DOM building,
// canvas set-up, tooltip, colours, sortable paginated tables). No dependencies, ES2020.
'use strict';

window.memsnap = (function () {
  const started = performance.now();

  // ---- data ----------------------------------------------------------------------------------
  function readData() {
    const value = readJson('memsnap-data');
    return value && typeof value === 'object' && !Array.isArray(value) ? value : {};
  }
  // A data block of the page (script type="application/json"), parsed; null when absent or empty.
  function readJson(id) {
    const node = document.getElementById(id);
    if (!node) return null;
    const text = node.textContent || '';
    if (!text.trim()) return null;
    return JSON.parse(text);
  }
  const arr = (v) => (Array.isArray(v) ? v : []);
  const obj = (v) => (v && typeof v === 'object' && !Array.isArray(v) ? v : {});
  const num = (v, fallback = NaN) => (typeof v === 'number' && isFinite(v) ? v : fallback);
  const str = (v, fallback = '') => (typeof v === 'string' ? v : v == null ? fallback : String(v));

  // ---- formatting ----------------------------------------------------------------------------
  const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  function fmtBytes(bytes) {
    if (typeof bytes !== 'number' || !isFinite(bytes)) return '–';
    const neg = bytes < 0;
    let v = Math.abs(bytes);
    let u = 0;
    while (v >= 1024 && u < BYTE_UNITS.length - 1) { v /= 1024; u++; }
    const s = u === 0 ? String(Math.round(v)) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
    return (neg ? '−' : '') + s + ' ' + BYTE_UNITS[u];
  }
  function fmtSignedBytes(bytes) {
    if (typeof bytes !== 'number' || !isFinite(bytes)) return '–';
    return (bytes > 0 ? '+' : '') + fmtBytes(bytes);
  }
  function fmtInt(n) {
    if (typeof n !== 'number' || !isFinite(n)) return '–';
    return Math.round(n).toLocaleString('en-US');
  }
  function fmtExactBytes(n) {
    return typeof n === 'number' && isFinite(n) ? fmtInt(n) + ' B' : '–';
  }
  function fmtDur(ns) {
    if (typeof ns !== 'number' || !isFinite(ns)) return '–';
    const a = Math.abs(ns);
    const sig = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));
    if (a < 1e3) return Math.round(ns) + ' ns';
    if (a < 1e6) return sig(ns / 1e3) + ' µs';
    if (a < 1e9) return sig(ns / 1e6) + ' ms';
    if (a < 600e9) return sig(ns / 1e9) + ' s';
    return sig(ns / 60e9) + ' min';
  }
  // A time in the window, relative to its opening.
  function fmtRel(ns) {
    if (typeof ns !== 'number' || !isFinite(ns)) return '–';
    return (ns < 0 ? '−' : '+') + fmtDur(Math.abs(ns));
  }
  function fmtPct(f) {
    if (typeof f !== 'number' || !isFinite(f)) return '–';
    const p = f * 100;
    return (p >= 10 || p === 0 ? p.toFixed(0) : p.toFixed(1)) + '%';
  }
  function fmtHex(addr) {
    if (addr == null || addr === '') return '–';
    if (typeof addr === 'number') return '0x' + Math.max(0, addr).toString(16);
    return '0x' + String(addr).replace(/^0x/i, '');
  }
  function addHex(addrHex, offset) {
    try {
      return '0x' + (BigInt('0x' + String(addrHex).replace(/^0x/i, '')) + BigInt(Math.round(offset))).toString(16);
    } catch (e) {
      return '–';
    }
  }

  // Axis ticks: "nice" linear steps; for bytes the unit is binary, the multiplier decimal.
  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }
  // Steps are whole bytes at least, and no two ticks read the same ("1 B, 1 B, 0 B" was a step of
  // half a byte): where the labels' rounding would repeat one, the step grows until none does.
  function byteTicks(max, count) {
    if (!(max > 0)) return { step: 1, ticks: [0] };
    let unit = 1;
    while (max / unit >= 1024 * 2 && unit < Math.pow(1024, 5)) unit *= 1024;
    let step = Math.max(1, niceStep(max / unit / Math.max(1, count)) * unit);
    for (let tries = 0; tries < 8; tries++) {
      const labels = [];
      for (let v = 0; v <= max * 1.0001; v += step) labels.push(fmtBytes(v));
      if (new Set(labels).size === labels.length) break;
      step = niceStep(step * 1.5);
    }
    const ticks = [];
    for (let v = 0; v <= max * 1.0001; v += step) ticks.push(v);
    return { step, ticks };
  }
  function timeTicks(t0, t1, count) {
    const step = niceStep((t1 - t0) / Math.max(1, count));
    const ticks = [];
    for (let v = Math.ceil(t0 / step) * step; v <= t1; v += step) ticks.push(v);
    return { step, ticks };
  }

  // ---- DOM -----------------------------------------------------------------------------------
  // Links come from the data; only relative references are allowed (no scheme, no //host).
  function safeHref(v) {
    if (typeof v !== 'string') return null;
    const t = v.replace(/[\u0000-\u0020\u007f]/g, '');
    if (!t) return null;
    if (/^[a-z][a-z0-9+.\-]*:/i.test(t) || /^[\\/][\\/]/.test(t)) return null;
    return t;
  }
  // Builds an element. Strings always become text nodes: data never reaches innerHTML.
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v == null || v === false) continue;
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = String(v);
        else if (k === 'style') e.style.cssText = v;
        else if (k === 'dataset') for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
        else if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
        else if (k === 'href') {
          const s = safeHref(v);
          if (s) e.setAttribute('href', s);
        } else e.setAttribute(k, v === true ? '' : String(v));
      }
    }
    append(e, kids);
    return e;
  }
  function append(e, kids) {
    for (const k of kids.flat(Infinity)) {
      if (k == null || k === false) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  function clear(e) {
    while (e.firstChild) e.removeChild(e.firstChild);
    return e;
  }
  function kvList(pairs) {
    const dl = h('div', { class: 'kv' });
    for (const [k, v] of pairs) {
      if (v == null) continue;
      dl.append(h('div', { class: 'k' }, k), h('div', { class: 'v' }, v));
    }
    return dl;
  }
  function statTile(key, value, note, cls) {
    return h('div', { class: 'stat' + (cls ? ' ' + cls : '') },
      h('div', { class: 'k' }, key), h('div', { class: 'v' }, value), note ? h('div', { class: 'n' }, note) : null);
  }
  // The status badge; with an OOM, the OOM badge alone when the record itself is whole ("ok"
  // beside "OOM" read as a contradiction).
  function statusBadges(status, oom, oomText) {
    const s = str(status, 'unknown');
    const out = [];
    if (!(oom && s === 'ok')) out.push(statusBadge(s));
    if (oom) out.push(h('span', { class: 'badge solid-bad', dataset: { oom: '1' }, title: 'an allocation failed' }, oomText || 'OOM'));
    return out;
  }
  function statusBadge(status) {
    const s = str(status, 'unknown');
    const cls = s === 'ok' ? 'ok' : s === 'truncated' ? 'warn' : 'bad';
    return h('span', { class: 'badge ' + cls, title: 'status' }, s);
  }
  function card(title, opts = {}) {
    const header = h('header', null, h('h2', null, title), opts.hint ? h('span', { class: 'hint' }, opts.hint) : null);
    if (opts.tools) append(header, [h('span', { class: 'grow' }), opts.tools]);
    const body = h('div', { class: 'body' + (opts.flush ? ' flush' : '') });
    const el = h('section', { class: 'card', id: opts.id || null }, header, body);
    return { el, header, body };
  }
  function topbar(crumb, links) {
    const nav = h('nav');
    for (const l of links) {
      const href = safeHref(l.href);
      nav.append(href ? h('a', { href, title: l.title || null }, l.label) : h('span', { class: 'disabled', title: l.title || null }, l.label));
    }
    return h('div', { class: 'topbar' }, h('div', { class: 'brand' }, h('span', { class: 'brand-mark' }), 'memsnap'),
      h('span', { class: 'crumb' }, crumb), h('span', { class: 'spacer' }), nav);
  }
  function emptyNote(text) { return h('div', { class: 'empty' }, text); }

  // Frames: {name, file, line}; innermost first.
  function stackList(frames, limit) {
    if (!frames || frames.length === 0) return h('div', { class: 'none' }, 'no stack recorded');
    const ol = h('ol', { class: 'stack' });
    const n = limit ? Math.min(limit, frames.length) : frames.length;
    for (let i = 0; i < n; i++) {
      const f = frames[i] || {};
      const loc = f.file ? str(f.file) + (num(f.line, 0) > 0 ? ':' + f.line : '') : '';
      ol.append(h('li', null, h('span', { class: 'fn' }, str(f.name, '??')), loc ? h('span', { class: 'loc' }, loc) : null));
    }
    if (n < frames.length) ol.append(h('li', { class: 'none' }, '… ' + (frames.length - n) + ' more frames'));
    return ol;
  }

  // ---- tooltip -------------------------------------------------------------------------------
  let tipEl = null;
  function tip(x, y, content) {
    if (!tipEl) { tipEl = h('div', { class: 'tip', role: 'tooltip' }); document.body.append(tipEl); }
    clear(tipEl);
    append(tipEl, [content]);
    tipEl.style.display = 'block';
    const w = tipEl.offsetWidth, hgt = tipEl.offsetHeight;
    let left = x + 14, top = y + 14;
    if (left + w > window.innerWidth - 8) left = Math.max(8, x - w - 14);
    if (top + hgt > window.innerHeight - 8) top = Math.max(8, y - hgt - 14);
    tipEl.style.left = left + 'px';
    tipEl.style.top = top + 'px';
  }
  function hideTip() { if (tipEl) tipEl.style.display = 'none'; }
  function tipBody(title, pairs, extra) {
    const kv = h('div', { class: 'kv' });
    for (const [k, v] of pairs) if (v != null) kv.append(h('div', { class: 'k' }, k), h('div', { class: 'v' }, v));
    return [h('div', { class: 't' }, title), kv, extra || null];
  }

  // ---- canvas --------------------------------------------------------------------------------
  function setupCanvas(canvas, width, height) {
    const dpr = Math.max(1, window.devicePixelRatio || 1);
    canvas.width = Math.max(1, Math.round(width * dpr));
    canvas.height = Math.max(1, Math.round(height * dpr));
    canvas.style.width = width + 'px';
    canvas.style.height = height + 'px';
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }
  const varCache = new Map();
  function cssVar(name) {
    if (!varCache.has(name)) varCache.set(name, getComputedStyle(document.documentElement).getPropertyValue(name).trim() || '#888');
    return varCache.get(name);
  }
  // Re-runs fn when the element's width changes (after layout settles).
  function onWidthChange(el, fn) {
    let last = el.clientWidth;
    if (typeof ResizeObserver === 'undefined') return;
    const ro = new ResizeObserver(() => {
      const w = el.clientWidth;
      if (w !== last && w > 0) { last = w; requestAnimationFrame(fn); }
    });
    ro.observe(el);
  }

  // ---- colours -------------------------------------------------------------------------------
  const KNOWN = {
    parameters: '#4e79a7', params: '#4e79a7', gradients: '#f28e2b', grads: '#f28e2b',
    optimizer_state: '#a66fb5', optimizer: '#a66fb5', all_gather: '#4fb3aa', reduce_scatter: '#e0b530',
    activations: '#59a14f', temporaries: '#e8879c', workspace: '#9c755f', other: '#9aa1ad', unknown: '#9aa1ad',
  };
  const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#a66fb5', '#4fb3aa', '#e0b530', '#e8879c', '#9c755f', '#6f8fcf', '#c7a97e'];
  function categoryColors(names) {
    let next = 0;
    return names.map((n) => KNOWN[String(n).toLowerCase()] || PALETTE[next++ % PALETTE.length]);
  }
  function hexToRgb(hex) {
    const m = /^#?([0-9a-f]{6})$/i.exec(hex);
    const v = m ? parseInt(m[1], 16) : 0x888888;
    return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  }
  function mix(hex, toward, amount) {
    const a = hexToRgb(hex), b = hexToRgb(toward);
    const c = a.map((x, i) => Math.round(x + (b[i] - x) * amount));
    return 'rgb(' + c.join(',') + ')';
  }
  // Neighbouring bands of one colour get slightly different shades so each stays visible.
  function shades(hex) {
    return [mix(hex, '#ffffff', 0), mix(hex, '#ffffff', 0.22), mix(hex, '#000000', 0.12), mix(hex, '#ffffff', 0.38)];
  }
  function hslHex(hue, s, l) {
    s /= 100; l /= 100;
    const k = (n) => (n + hue / 30) % 12;
    const a = s * Math.min(l, 1 - l);
    const f = (n) => l - a * Math.max(-1, Math.min(k(n) - 3, Math.min(9 - k(n), 1)));
    const to = (x) => Math.round(x * 255).toString(16).padStart(2, '0');
    return '#' + to(f(0)) + to(f(8)) + to(f(4));
  }
  // 24 well-separated hues for colouring by stack (golden-angle spacing).
  const STACK_PALETTE = Array.from({ length: 24 }, (_, i) => hslHex((i * 137.508) % 360, 52 + (i % 3) * 8, 50 + (i % 4) * 5));
  function stackColorIndex(id) {
    let x = (id | 0) + 0x9e3779b9;
    x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
    x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
    x ^= x >>> 16;
    return (x >>> 0) % STACK_PALETTE.length;
  }
  // Sequential colour map for heatmaps (dark blue -> teal -> yellow).
  const RAMP = [[48, 18, 99], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function ramp(f) {
    if (!(f >= 0)) f = 0;
    if (f > 1) f = 1;
    const x = f * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(x));
    const t = x - i;
    const c = RAMP[i].map((v, j) => Math.round(v + (RAMP[i + 1][j] - v) * t));
    return 'rgb(' + c.join(',') + ')';
  }

  // ---- tables --------------------------------------------------------------------------------
  // columns: [{key, label, value(row) (sort key), render(row) -> Node|string, num, title}]
  function dataTable(opts) {
    const { columns, pageSize = 50, expand, onRowClick, rowAttrs, filterText } = opts;
    let rows = opts.rows || [];
    let sortKey = opts.sort ? opts.sort.key : null;
    let sortDir = opts.sort ? opts.sort.dir : 'desc';
    let page = 0;
    let query = '';
    const expanded = new Set();
    const thead = h('thead');
    const tbody = h('tbody');
    const table = h('table', { class: 'data' }, thead, tbody);
    const info = h('span');
    const prev = h('button', { class: 'icon', title: 'previous page', onclick: () => { page--; draw(); } }, '‹ Prev');
    const next = h('button', { class: 'icon', title: 'next page', onclick: () => { page++; draw(); } }, 'Next ›');
    const pager = h('div', { class: 'pager' }, info, prev, next);
    const search = filterText ? h('input', { type: 'search', placeholder: opts.filterPlaceholder || 'Filter…', 'aria-label': 'filter rows' }) : null;
    if (search) search.addEventListener('input', () => { query = search.value.trim().toLowerCase(); page = 0; draw(); });
    const el = h('div', { class: 'table-wrap' });
    if (search || opts.tools) el.append(h('div', { class: 'table-tools' }, search, h('span', { class: 'grow' }), opts.tools || null));
    el.append(h('div', { class: 'table-scroll' }, table), pager);
    const nCols = columns.length + (expand ? 1 : 0);

    function header() {
      clear(thead);
      const tr = h('tr');
      if (expand) tr.append(h('th', { class: 'expander' }));
      for (const c of columns) {
        const th = h('th', { class: (c.num ? 'num ' : '') + (c.value ? 'sortable' : ''), title: c.title || null, dataset: { key: c.key } }, c.label);
        if (c.value) {
          th.setAttribute('aria-sort', c.key === sortKey ? (sortDir === 'asc' ? 'ascending' : 'descending') : 'none');
          th.addEventListener('click', () => {
            if (sortKey === c.key) sortDir = sortDir === 'asc' ? 'desc' : 'asc';
            else { sortKey = c.key; sortDir = c.num ? 'desc' : 'asc'; }
            page = 0;
            draw();
          });
        }
        tr.append(th);
      }
      thead.append(tr);
    }
    function view() {
      let list = rows.map((r, i) => ({ r, i }));
      if (query && filterText) list = list.filter((x) => filterText(x.r).toLowerCase().includes(query));
      const col = columns.find((c) => c.key === sortKey);
      if (col && col.value) {
        const sign = sortDir === 'asc' ? 1 : -1;
        const keys = new Map(list.map((x) => [x.i, col.value(x.r)]));
        list.sort((a, b) => {
          const ka = keys.get(a.i), kb = keys.get(b.i);
          if (ka === kb) return a.i - b.i;
          if (ka == null || (typeof ka === 'number' && isNaN(ka))) return 1;
          if (kb == null || (typeof kb === 'number' && isNaN(kb))) return -1;
          return (ka < kb ? -1 : 1) * sign;
        });
      }
      return list;
    }
    function draw() {
      header();
      clear(tbody);
      const list = view();
      const pages = Math.max(1, Math.ceil(list.length / pageSize));
      page = Math.max(0, Math.min(page, pages - 1));
      const from = page * pageSize, to = Math.min(list.length, from + pageSize);
      for (let k = from; k < to; k++) {
        const { r, i } = list[k];
        const attrs = rowAttrs ? rowAttrs(r) : {};
        const tr = h('tr', Object.assign({}, attrs, { class: 'row' + (expand || onRowClick ? ' clickable' : '') + (attrs.class ? ' ' + attrs.class : '') }));
        if (expand) tr.append(h('td', { class: 'expander' }, expanded.has(i) ? '▾' : '▸'));
        for (const c of columns) {
          const td = h('td', { class: c.num ? 'num' : null });
          append(td, [c.render ? c.render(r) : c.value ? String(c.value(r)) : '']);
          tr.append(td);
        }
        tr.addEventListener('click', (ev) => {
          if (ev.target.closest('a,button')) return;
          if (expand) { if (expanded.has(i)) expanded.delete(i); else expanded.add(i); draw(); }
          if (onRowClick) onRowClick(r, ev);
        });
        tbody.append(tr);
        if (expand && expanded.has(i)) {
          const td = h('td', { colspan: nCols });
          append(td, [expand(r)]);
          tbody.append(h('tr', { class: 'detail' }, td));
        }
      }
      if (list.length === 0) tbody.append(h('tr', null, h('td', { colspan: nCols, class: 'empty' }, opts.emptyText || 'nothing to show')));
      info.textContent = list.length === 0 ? '0 rows' : (from + 1) + '–' + to + ' of ' + fmtInt(list.length) + (query ? ' (filtered from ' + fmtInt(rows.length) + ')' : '');
      prev.disabled = page === 0;
      next.disabled = page >= pages - 1;
      pager.style.display = list.length > pageSize || page > 0 ? '' : 'none';
      el.dataset.rows = String(list.length);
    }
    draw();
    return {
      el,
      refresh: draw,
      setRows(r) { rows = r; draw(); },
      // Shows the page holding the row for which pred is true and expands it.
      reveal(pred) {
        const list = view();
        const k = list.findIndex((x) => pred(x.r));
        if (k < 0) return null;
        page = Math.floor(k / pageSize);
        if (expand) expanded.add(list[k].i);
        draw();
        return tbody.querySelectorAll('tr.row')[k - page * pageSize] || null;
      },
    };
  }

  // ---- findings ------------------------------------------------------------------------------
  // A finding's anchor on its rank page: "finding-KIND[-BATCH]" (report.cpp gives each the same).
  function findingAnchor(f) {
    const o = obj(f);
    if (typeof o.anchor === 'string' && o.anchor) return o.anchor;
    const b = o.batch;
    return 'finding-' + str(o.kind, 'finding') + (typeof b === 'number' && isFinite(b) ? '-' + b : '');
  }
  const KIND_LABEL = { leak: 'leak', shard_imbalance: 'shard imbalance', spike: 'spike', oom: 'OOM', missing: 'missing', truncated: 'truncated' };

  // ---- page lifecycle ------------------------------------------------------------------------
  function ready(extra) {
    const b = document.body;
    for (const [k, v] of Object.entries(extra || {})) b.dataset[k] = String(v);
    b.dataset.renderMs = (performance.now() - started).toFixed(1);
    b.dataset.readyAtMs = performance.now().toFixed(1);
    b.dataset.ready = '1';
  }
  function safely(what, fn) {
    try {
      return fn();
    } catch (e) {
      if (window.memsnapRecordError) window.memsnapRecordError(what + ': ' + (e && e.stack || e));
      return null;
    }
  }
  const selftest = /(^|[#&])selftest($|&)/.test(location.hash.slice(1));

  return {
    readData, readJson, arr, obj, num, str,
    fmtBytes, fmtSignedBytes, fmtInt, fmtExactBytes, fmtDur, fmtRel, fmtPct, fmtHex, addHex,
    niceStep, byteTicks, timeTicks,
    safeHref, h, append, clear, kvList, statTile, statusBadge, statusBadges, card, topbar, emptyNote, stackList,
    tip, hideTip, tipBody,
    setupCanvas, cssVar, onWidthChange,
    categoryColors, mix, shades, STACK_PALETTE, stackColorIndex, ramp,
    dataTable, ready, safely, selftest, started, findingAnchor, KIND_LABEL,
  };
})();
