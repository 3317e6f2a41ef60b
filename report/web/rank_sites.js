// memsnap report, rank page: the top allocation sites at the peak, a sortable, filterable table;
// a row opens its stack, 'Show' highlights the site's allocations on the timeline.
'use strict';

window.memsnapRank.sites = (function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtExactBytes, fmtInt, fmtPct } = M;
  const R = window.memsnapRank;
  const { D, stackFrames, topFrameText, catName, catColor, nBands, bStack, peakV } = R;
  const tl = { get el() { return R.timeline.el; } };
  const setHighlight = (hl) => R.timeline.setHighlight(hl);

  const sites = arr(D.sites).map((s, i) => Object.assign({ idx: i + 1 }, obj(s)));
  const siteTotal = isFinite(peakV) && peakV > 0 ? peakV : sites.reduce((a, s) => a + num(s.bytes, 0), 0);
  const sitesCard = M.card('Top allocation sites at the peak', { id: 'sites', hint: 'bytes live at the peak, by allocation site; click a row for its stack' });
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
          const highlight = R.timeline.highlight();
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

  function build(main) {
    main.append(sitesCard.el);
  }
  // Self test (#selftest, rank.js): sort by bytes, open a row's stack.
  function selfTest(check) {
    if (sitesTable) {
      check('sort', () => {
        sitesCard.el.querySelector('th[data-key="bytes"]').click();
        const th = sitesCard.el.querySelector('th[data-key="bytes"]');
        const vals = Array.from(sitesCard.el.querySelectorAll('tr.site-row')).map((r) => Number(r.dataset.bytes));
        return th.getAttribute('aria-sort') === 'ascending' && vals.every((v, i) => i === 0 || vals[i - 1] <= v);
      });
      check('expand', () => { sitesCard.el.querySelector('tr.site-row').click(); return !!sitesCard.el.querySelector('tr.detail ol.stack, tr.detail .none'); });
    }
  }

  return { build, selfTest, get table() { return sitesTable; } };
})();
