// memsnap report, rank page: the bytes live at the window's allocated peak by stack, an icicle
// flame graph (flame.js). The root is every byte live at the peak (the page's "Peak allocated");
// its children are the outermost frames, each node's children the frames it called, its width
// its bytes; colours are the allocations' categories (an inner frame's: the category most of its
// bytes have). The data: the page's "flame" block (page_data.cpp), bytes per page stack.
'use strict';

window.memsnapRank.flame = (function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes } = M;
  const R = window.memsnapRank;
  const { D, stacks, F, categories, catColors, siteOfStack, peakV } = R;
  const fName = arr(F.name), fFile = arr(F.file), fLine = arr(F.line);

  // The tree, in flame.js's format: a node per frame on a path from the outermost frame in.
  // Stacks without frames hang under the root by their site ('<no stack>').
  const FL = obj(D.flame);
  const colStack = arr(FL.stack), colCat = arr(FL.category), colBytes = arr(FL.bytes);
  function buildTree() {
    const root = { name: 'all', bytes: 0, children: [], byCat: new Map() };
    const add = (node, bytes, cat) => {
      node.bytes += bytes;
      node.byCat.set(cat, (node.byCat.get(cat) || 0) + bytes);
    };
    const childOf = (node, key, make) => {
      if (!node.kids) node.kids = new Map();
      let c = node.kids.get(key);
      if (!c) { c = Object.assign({ bytes: 0, children: [], byCat: new Map() }, make()); node.kids.set(key, c); node.children.push(c); }
      return c;
    };
    const n = Math.min(colStack.length, colBytes.length);
    for (let i = 0; i < n; i++) {
      const bytes = Math.max(0, num(colBytes[i], 0));
      if (!(bytes > 0)) continue;
      const id = num(colStack[i], -1), cat = num(colCat[i], -1);
      add(root, bytes, cat);
      const frames = Array.isArray(stacks[id]) ? stacks[id] : [];
      if (!frames.length) {
        const site = siteOfStack(id) || '<no stack>';
        add(childOf(root, 'site:' + site, () => ({ name: site })), bytes, cat);
        continue;
      }
      // Page stacks are innermost first: walk them from the end.
      let node = root;
      for (let k = frames.length - 1; k >= 0; k--) {
        const f = frames[k];
        node = childOf(node, f, () => ({ name: str(fName[f], '??'), file: str(fFile[f]), line: num(fLine[f], 0) }));
        add(node, bytes, cat);
      }
    }
    // A node's colour: the category most of its bytes have.
    (function settle(node) {
      let best = -1, most = -1;
      for (const [c, b] of node.byCat) if (b > most) { most = b; best = c; }
      node.category = best;
      delete node.byCat;
      delete node.kids;
      node.children.forEach(settle);
    })(root);
    return root;
  }
  const tree = buildTree();

  const card = M.card('Bytes at the peak by stack', { id: 'flame', hint: 'an icicle flame graph: outermost frames on top, each frame as wide as the bytes under it; hover for a frame, click to zoom' });
  const box = h('div', { class: 'flame' });
  let handle = null;

  function build(main) {
    main.append(card.el);
    if (!(tree.bytes > 0)) {
      card.body.append(M.emptyNote(colStack.length ? 'no bytes live at the peak' : 'no stacks recorded at the peak'));
      return;
    }
    const legend = h('div', { class: 'legend', style: 'margin-bottom:8px' });
    const shown = new Set();
    (function seen(n) { if (n.category >= 0) shown.add(n.category); n.children.forEach(seen); })(tree);
    for (const c of categories.map((_, i) => i).filter((i) => shown.has(i))) {
      legend.append(h('span', { class: 'item' }, h('span', { class: 'sw', style: 'background:' + catColors[c] }), categories[c]));
    }
    legend.append(h('span', { class: 'item' }, 'all: ', h('b', null, fmtBytes(tree.bytes))));
    card.body.append(legend, box);
  }
  function start() {
    if (!(tree.bytes > 0)) return;
    handle = M.drawIcicle(box, tree, {
      categories, colors: catColors, rootName: 'all bytes at the peak', shareLabel: 'of the peak',
    });
    // What the tests read: the root and the path of widest frames from it.
    box.dataset.peak = String(isFinite(peakV) ? peakV : '');
    box.dataset.widestPath = handle.widestPath().slice(1).map((n) => n.name + (n.file ? ' (' + n.file + (n.line > 0 ? ':' + n.line : '') + ')' : '')).join(' > ');
  }

  // Self test (#selftest, rank.js): hovering the root's widest child says its bytes and share;
  // a click zooms into it, Esc zooms out.
  function selfTest(check, fire) {
    if (!handle || !tree.children.length) return;
    const widest = handle.widestPath()[1];
    const r = handle.rectOf(widest);
    const c = handle.canvas.getBoundingClientRect();
    const x = c.left + r.x + Math.min(r.w / 2, 20), y = c.top + r.y + r.h / 2;
    check('flame-hover', () => {
      fire(handle.canvas, 'mousemove', x, y);
      const t = document.querySelector('.tip');
      const read = box.querySelector('.flame-readout');
      return t && t.style.display === 'block' && t.textContent.includes(widest.name) && t.textContent.includes(fmtBytes(widest.bytes)) &&
        read.dataset.name === widest.name && read.textContent.includes('of the peak');
    });
    check('flame-zoom', () => {
      fire(handle.canvas, 'click', x, y);
      const zoomed = box.dataset.zoom === widest.name && handle.zoomed() === widest;
      handle.canvas.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: false }));
      return zoomed && box.dataset.zoom === '' && handle.zoomed() === null;
    });
  }

  return { build, start, selfTest, tree };
})();
