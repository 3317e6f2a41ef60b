// memsnap report: an icicle flame graph (bytes by stack), on a canvas. Used by the rank page
// (bytes at the peak) and meant for any page that shows bytes by stack, a diff's included.
//
//   const handle = memsnap.drawIcicle(container, tree, options);
//
// tree: the root node. A node is a plain object:
//   { name: 'forward',          what the node is: a function, or a label ('<no stack>')
//     file: 'model.py',         optional: its file, and line (a number, > 0 to be shown)
//     line: 130,
//     bytes: 123456,            its width: the bytes under it, its own included (>= 0)
//     category: 5,              optional: an index into options.categories / options.colors
//     delta: -4096,             optional: its change against a base (options.delta)
//     children: [node, ...] }   optional; their bytes add up to at most the node's own
// The root is the whole: its bytes are 100 % ("share" in the hover is of the root's bytes). The
// root is drawn on top, its children below it from the left, widest first (an icicle: outermost
// frames at the top, innermost at the bottom). A node's own bytes are its bytes less its
// children's. The tree is read, never changed.
//
// options (every one optional):
//   categories: ['parameters', ...]   the name of each category index (the hover says it)
//   colors: ['#4e79a7', ...]          the colour (#rrggbb) of each category index; else grey
//   color: (node) => css colour       overrides categories' colours
//   delta: true                       a differential flame graph: a node's colour says its
//                                     node.delta (growth red, shrink blue, the strength its
//                                     |delta| against the largest |delta| of the tree); the
//                                     hover adds the change. Widths stay node.bytes: give a node
//                                     bytes = max(base, new) so what shrank away stays visible.
//   rootName: 'all bytes at the peak'  the root's label (else its name)
//   shareLabel: 'of the peak'          the hover's words after the share
//   rowHeight: 18                     px per row; maxHeight: 600 px, the chart scrolls beyond
//   onZoom: (node|null) => void        after a click zoomed (null: back at the root)
//
// Click a node to zoom into it (it fills the width, its ancestors stay above it); click an
// ancestor, the root, 'Reset zoom' or press Esc over the chart to zoom out.
//
// handle: { root: tree, zoom(node|null), zoomed() -> node|null, nodeAt(x, y) -> node|null (x, y
//   in the canvas' CSS pixels), rectOf(node) -> {x, y, w, h}|null, widestPath() -> [node, ...]
//   (from the root, always the widest child), redraw(), canvas }
// The container gets data-nodes (nodes in the tree), data-root-bytes, data-depth and
// data-zoom (the zoomed node's label, '' at the root); its readout line (.flame-readout) says
// the hovered node, in words.
'use strict';

(function () {
  const M = window.memsnap;
  const { h, num, str, fmtBytes, fmtExactBytes, fmtPct, fmtSignedBytes } = M;

  function label(n) {
    return str(n.name, '??');
  }
  function where(n) {
    const file = str(n.file);
    if (!file) return '';
    const line = num(n.line, 0);
    return file + (line > 0 ? ':' + line : '');
  }
  // A small stable hash of a string, for shade variation between neighbours of one colour.
  function hashOf(s) {
    let x = 0;
    for (let i = 0; i < s.length; i++) x = (Math.imul(x, 31) + s.charCodeAt(i)) | 0;
    return x >>> 0;
  }

  function drawIcicle(container, tree, options) {
    const opts = options || {};
    const rowH = num(opts.rowHeight, 18);
    const maxHeight = num(opts.maxHeight, 600);
    const categories = Array.isArray(opts.categories) ? opts.categories : [];
    const colors = Array.isArray(opts.colors) ? opts.colors : [];
    const diff = !!opts.delta;

    // Internal nodes: {n (the caller's node), off (bytes from the root's left edge), w (bytes),
    // depth, parent, kids (widest first)}.
    let count = 0, maxDepth = 0, maxAbsDelta = 0;
    function build(n, off, depth, parent) {
      const node = { n, off, w: Math.max(0, num(n.bytes, 0)), depth, parent, kids: [] };
      count++;
      if (depth > maxDepth) maxDepth = depth;
      if (diff) maxAbsDelta = Math.max(maxAbsDelta, Math.abs(num(n.delta, 0)));
      const kids = (Array.isArray(n.children) ? n.children : []).filter((c) => c && num(c.bytes, 0) > 0);
      kids.sort((a, b) => num(b.bytes, 0) - num(a.bytes, 0));
      let x = off;
      for (const c of kids) {
        const k = build(c, x, depth + 1, node);
        node.kids.push(k);
        x += k.w;
      }
      return node;
    }
    const root = build(tree && typeof tree === 'object' ? tree : { name: 'empty', bytes: 0 }, 0, 0, null);
    const byCaller = new Map();
    (function index(k) { byCaller.set(k.n, k); k.kids.forEach(index); })(root);

    const canvas = h('canvas', { class: 'interactive flame-canvas', tabindex: '0', 'aria-label': 'icicle flame graph' });
    const readout = h('div', { class: 'flame-readout' });
    const btnReset = h('button', { onclick: () => zoom(null), title: 'show the whole tree (Esc)' }, 'Reset zoom');
    const crumb = h('span', { class: 'label mono flame-crumb' });
    M.clear(container);
    container.append(h('div', { class: 'toolbar' }, btnReset, crumb),
      h('div', { class: 'canvas-wrap flame-wrap', style: 'max-height:' + maxHeight + 'px;overflow-y:auto' }, canvas), readout);
    container.dataset.nodes = String(count);
    container.dataset.rootBytes = String(root.w);
    container.dataset.depth = String(maxDepth + 1);

    let zoomed = root, hover = null, W = 600, ctx = null;
    const H = () => (maxDepth + 1) * rowH;
    const isAncestor = (a, k) => { for (let p = k; p; p = p.parent) if (p === a) return true; return false; };
    function xOf(k) {
      if (k.depth <= zoomed.depth) return isAncestor(k, zoomed) ? { x: 0, w: W } : null;
      if (!isAncestor(zoomed, k) || !(zoomed.w > 0)) return null;
      return { x: ((k.off - zoomed.off) / zoomed.w) * W, w: (k.w / zoomed.w) * W };
    }
    function rectOf(k) {
      const r = xOf(k);
      return r ? { x: r.x, y: k.depth * rowH, w: r.w, h: rowH } : null;
    }

    function fill(k) {
      const n = k.n;
      if (typeof opts.color === 'function') {
        const c = opts.color(n);
        if (c) return c;
      }
      if (diff) {
        const d = num(n.delta, 0);
        if (d === 0 || !(maxAbsDelta > 0)) return M.mix('#9aa1ad', '#ffffff', 0.45);
        const s = 0.25 + 0.75 * Math.min(1, Math.abs(d) / maxAbsDelta);
        return M.mix(d > 0 ? '#d92d20' : '#2e6fd9', '#ffffff', 1 - s);
      }
      const c = num(n.category, -1);
      const base = c >= 0 && c < colors.length ? colors[c] : '#9aa1ad';
      return M.mix(base, '#ffffff', 0.1 + (hashOf(label(n) + where(n)) % 4) * 0.08);
    }

    function draw() {
      W = Math.max(320, container.clientWidth - 2);
      ctx = M.setupCanvas(canvas, W, H());
      const c = ctx;
      c.clearRect(0, 0, W, H());
      c.font = '11.5px ' + M.cssVar('--sans');
      c.textBaseline = 'middle';
      const fg = '#1d2330';
      const walk = (k) => {
        const r = xOf(k);
        if (!r || r.w < 0.5) return;
        const y = k.depth * rowH;
        c.fillStyle = k.depth < zoomed.depth ? M.mix('#9aa1ad', '#ffffff', 0.55) : fill(k);
        c.fillRect(r.x, y, Math.max(0.5, r.w - 1), rowH - 1);
        if (r.w > 28) {
          const text = k === root && opts.rootName ? str(opts.rootName) : label(k.n);
          let t = text;
          const room = r.w - 8;
          if (c.measureText(t).width > room) {
            let lo = 0, hi = t.length;
            while (lo < hi) { const m = (lo + hi + 1) >> 1; if (c.measureText(t.slice(0, m) + '…').width <= room) lo = m; else hi = m - 1; }
            t = lo > 0 ? t.slice(0, lo) + '…' : '';
          }
          if (t) { c.fillStyle = fg; c.fillText(t, r.x + 4, y + rowH / 2); }
        }
        for (const kid of k.kids) walk(kid);
      };
      walk(root);
      if (hover) {
        const r = rectOf(hover);
        if (r) { c.strokeStyle = fg; c.lineWidth = 1.5; c.strokeRect(r.x + 0.75, r.y + 0.75, Math.max(1, r.w - 2.5), r.h - 2.5); }
      }
      container.dataset.zoom = zoomed === root ? '' : label(zoomed.n);
      crumb.textContent = zoomed === root ? '' : 'zoomed into ' + label(zoomed.n) + ' · ' + fmtBytes(zoomed.w) + ' · ' + fmtPct(root.w > 0 ? zoomed.w / root.w : 0) + ' of the whole';
      btnReset.disabled = zoomed === root;
    }

    function nodeAt(x, y) {
      const depth = Math.floor(y / rowH);
      if (depth < 0 || depth > maxDepth || x < 0 || x > W) return null;
      let k = root;
      while (k.depth < depth) {
        let next = null;
        for (const kid of k.kids) {
          const r = xOf(kid);
          if (r && x >= r.x && x < r.x + r.w) { next = kid; break; }
        }
        if (!next) return null;
        k = next;
      }
      return xOf(k) ? k : null;
    }

    // The hovered node in words: what the tooltip and the readout line say.
    function facts(k) {
      const n = k.n;
      const share = root.w > 0 ? k.w / root.w : 0;
      const own = k.w - k.kids.reduce((a, x) => a + x.w, 0);
      const pairs = [];
      if (where(n)) pairs.push(['at', where(n)]);
      pairs.push(['bytes', fmtBytes(k.w) + '  (' + fmtExactBytes(k.w) + ')']);
      pairs.push(['share', fmtPct(share) + ' ' + str(opts.shareLabel, 'of the whole')]);
      if (k.kids.length && own > 0) pairs.push(['own', fmtBytes(own)]);
      const c = num(n.category, -1);
      if (c >= 0 && c < categories.length) pairs.push(['category', str(categories[c])]);
      if (diff) pairs.push(['change', fmtSignedBytes(num(n.delta, 0))]);
      return { title: k === root && opts.rootName ? str(opts.rootName) : label(n), pairs, share };
    }
    function showReadout(k) {
      M.clear(readout);
      if (!k) {
        readout.append(h('span', { class: 'hint' }, 'Hover a frame for its bytes; click to zoom into it.'));
        delete readout.dataset.name;
        return;
      }
      const f = facts(k);
      readout.dataset.name = f.title;
      readout.append(h('b', null, f.title), ...f.pairs.map(([key, v]) => h('span', null, ' · ' + key + ' ', h('b', null, v))));
    }

    function zoom(n) {
      const k = n ? byCaller.get(n) : null;
      zoomed = k || root;
      draw();
      if (typeof opts.onZoom === 'function') opts.onZoom(zoomed === root ? null : zoomed.n);
    }

    const local = (ev) => { const r = canvas.getBoundingClientRect(); return { x: ev.clientX - r.left, y: ev.clientY - r.top }; };
    canvas.addEventListener('mousemove', (ev) => {
      const p = local(ev);
      const k = nodeAt(p.x, p.y);
      if (k !== hover) { hover = k; draw(); showReadout(k); }
      if (k) {
        const f = facts(k);
        M.tip(ev.clientX, ev.clientY, M.tipBody(f.title, f.pairs, h('div', { class: 'foot' }, k === zoomed ? 'click to zoom out' : 'click to zoom in')));
      } else M.hideTip();
    });
    canvas.addEventListener('mouseleave', () => { hover = null; M.hideTip(); showReadout(null); draw(); });
    canvas.addEventListener('click', (ev) => {
      const p = local(ev);
      const k = nodeAt(p.x, p.y);
      if (!k) return;
      // The zoomed node or one above it: one level out; anything else: into it.
      zoom(k === zoomed ? (k.parent && k.parent !== root ? k.parent.n : null) : k === root ? null : k.n);
    });
    canvas.addEventListener('keydown', (ev) => { if (ev.key === 'Escape') { zoom(null); ev.preventDefault(); } });

    showReadout(null);
    draw();
    M.onWidthChange(container, draw);

    return {
      root: tree,
      canvas,
      zoom,
      zoomed: () => (zoomed === root ? null : zoomed.n),
      nodeAt: (x, y) => { const k = nodeAt(x, y); return k ? k.n : null; },
      rectOf: (n) => { const k = byCaller.get(n); return k ? rectOf(k) : null; },
      widestPath: () => { const out = []; for (let k = root; k; k = k.kids[0]) out.push(k.n); return out; },
      redraw: draw,
    };
  }

  M.drawIcicle = drawIcicle;
})();
