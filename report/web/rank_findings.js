// memsnap report, rank page: the findings about this rank and window, first on the page. A
// finding clicked (or the one the cross page linked to) is shown on the timeline: its batch
// marked, the allocations it is about highlighted (rank_timeline.js draws them).
'use strict';

window.memsnapRank.findings = (function () {
  const M = window.memsnap;
  const { h, num, str, fmtBytes, fmtInt } = M;
  const R = window.memsnapRank;
  const { D, findings, nBands, tMin, tMax, bSize, bStart, bEnd, bStack, bEndDraw, lastLE, otherBand, allocatedTotal, batches, ooms, siteOfStack } = R;
  const rank = D.rank;
  const findingItems = [];
  const findingShown = [];

  function build(main) {
    const findingsCard = M.card('Findings about this rank', { id: 'findings', hint: findings.length ? 'click a finding to show its allocations and its batch on the timeline' : null });
    findingsCard.body.classList.add('flush');
    if (findings.length === 0) {
      findingsCard.body.append(h('div', { class: 'findings-none' }, 'No findings about rank ' + str(rank, '?') + ' in this window.'));
    } else {
      const ul = h('ul', { class: 'findings' });
      findings.forEach((f, k) => {
        const bytes = num(f.bytes, 0);
        const facts = [];
        if (bytes > 0) facts.push(str(f.kind) === 'oom' ? 'request of ' + fmtBytes(bytes) : str(f.kind) === 'leak' ? fmtBytes(bytes) + ' per batch' : fmtBytes(bytes));
        if (f.batch != null) facts.push('batch ' + str(f.batch) + (f.in_window === false ? ' (another window)' : ''));
        const shown = h('div', { class: 'shown' });
        findingShown.push(shown);
        const li = h('li', { class: 'finding', id: M.findingAnchor(f), dataset: { kind: str(f.kind), rank: str(f.rank), batch: str(f.batch, '') }, onclick: () => selectFinding(k, false) },
          h('div', null, h('span', { class: 'badge kind-' + str(f.kind) }, M.KIND_LABEL[str(f.kind)] || str(f.kind, '?'))),
          h('div', null,
            h('div', { class: 'headline' }, facts.join(' · ') || (M.KIND_LABEL[str(f.kind)] || str(f.kind)), f.site ? h('span', null, ' at ', h('code', null, str(f.site))) : null),
            f.detail ? h('div', { class: 'detail' }, str(f.detail)) : null, shown),
          h('div', { class: 'actions' }, h('a', { href: '#' + M.findingAnchor(f), onclick: (ev) => { ev.preventDefault(); selectFinding(k, true); } }, 'show on the timeline')));
        findingItems.push(li);
        ul.append(li);
      });
      findingsCard.body.append(ul);
    }
    main.append(findingsCard.el);
  }

  // The span of a batch in the window: from its start to the next batch's (or the window's end);
  // a batch that began before the window opened spans from the opening.
  function batchSpan(batch) {
    const k = batches.findIndex((x) => num(x.batch) === batch);
    if (k >= 0) return { t0: batches[k].t, t1: k + 1 < batches.length ? batches[k + 1].t : tMax };
    if (batches.length && batch < num(batches[0].batch) && batch >= num(D.batch_start, -Infinity)) return { t0: tMin, t1: batches[0].t };
    return null;
  }
  // The time of the highest allocated level in [t0, t1].
  function peakTimeIn(t0, t1) {
    const src = allocatedTotal.t.length ? allocatedTotal : { t: otherBand.t, v: otherBand.top };
    let best = t0, top = -1;
    const i0 = Math.max(0, lastLE(src.t, t0));
    for (let i = i0; i < src.t.length && src.t[i] <= t1; i++) if (src.v[i] > top) { top = src.v[i]; best = Math.max(t0, src.t[i]); }
    return best;
  }
  const liveAt = (b, t) => bStart[b] <= t && bEndDraw(b) > t;
  function largest(list, n) { return list.sort((x, y) => bSize[y] - bSize[x] || x - y).slice(0, n); }
  // Which bands a finding is about: a leak's kept allocations (made in the window, still live at
  // its end), a spike's largest live blocks at its batch's peak, an imbalance's held memory (live
  // at every batch boundary), an OOM's largest live blocks when the allocation failed.
  function findingBands(f) {
    const site = f.site == null ? null : str(f.site);
    const ofSite = [];
    for (let b = 0; b < nBands; b++) if (site == null || siteOfStack(bStack[b]) === site) ofSite.push(b);
    const kind = str(f.kind);
    const span = f.batch != null ? batchSpan(num(f.batch)) : null;
    let picked = [], what = '';
    if (kind === 'leak') {
      picked = ofSite.filter((b) => bEnd[b] === Infinity && bStart[b] >= tMin);
      what = 'kept allocations (made in this window, still live at its end)';
      if (!picked.length) { picked = ofSite.filter((b) => bEnd[b] === Infinity); what = 'allocations still live at the window\u2019s end'; }
    } else if (kind === 'spike' && span) {
      const t = peakTimeIn(span.t0, span.t1);
      picked = largest(ofSite.filter((b) => liveAt(b, t)), 20);
      what = 'largest blocks live at the peak of batch ' + str(f.batch);
    } else if (kind === 'shard_imbalance') {
      const ts = batches.length ? batches.map((x) => x.t) : [tMin, tMax];
      picked = ofSite.filter((b) => ts.every((t) => bStart[b] <= t && (bEnd[b] === Infinity || bEnd[b] >= t)));
      what = 'allocations held at every batch boundary';
    } else if (kind === 'oom' && ooms.length) {
      picked = largest(ofSite.filter((b) => liveAt(b, ooms[0].t)), 20);
      what = 'largest blocks live when the allocation failed';
    }
    if (!picked.length && kind !== 'oom' && site != null) { picked = ofSite; what = 'allocations'; }
    return { picked, what, site };
  }
  let activeFinding = -1;
  function selectFinding(k, scroll) {
    const f = findings[k];
    if (!f) return;
    activeFinding = k;
    findingItems.forEach((li, i) => li.classList.toggle('active', i === k));
    const { picked, what, site } = findingBands(f);
    const mask = new Uint8Array(nBands);
    let bytes = 0;
    for (const b of picked) { mask[b] = 1; bytes += bSize[b]; }
    const highlight = picked.length ? { kind: 'set', mask, label: str(f.kind) } : null;
    const span = f.batch != null && f.in_window !== false ? batchSpan(num(f.batch)) : null;
    const marked = span ? Object.assign({ batch: num(f.batch), label: 'batch ' + str(f.batch) + ' · ' + (M.KIND_LABEL[str(f.kind)] || str(f.kind)) }, span) : null;
    const shown = findingShown[k];
    M.clear(shown);
    if (picked.length) {
      shown.append('On the timeline: ', h('b', null, fmtInt(picked.length)), ' ' + what + (site ? ' of this site' : '') + ', ', h('b', null, fmtBytes(bytes)),
        marked ? ', in batch ' + marked.batch + ' (marked)' : '', '.');
    } else {
      shown.append(marked ? 'Batch ' + marked.batch + ' is marked on the timeline' : 'Nothing to mark on the timeline',
        site ? '; the allocations of this site are among the small ones summed into one band.' : '.');
    }
    shown.dataset.highlighted = String(picked.length);
    R.timeline.showFinding(highlight, marked, picked.length, scroll);
  }

  // The finding the cross page linked to (#finding-KIND[-BATCH]), else the first of this window.
  function start() {
    if (!findings.length) return;
    const wanted = location.hash.slice(1).split('&').find((x) => x.startsWith('finding-'));
    let k = wanted ? findings.findIndex((f) => M.findingAnchor(f) === decodeURIComponent(wanted)) : -1;
    if (k < 0) k = Math.max(0, findings.findIndex((f) => f.in_window !== false));
    selectFinding(k, false);
    if (wanted && findingItems[k]) findingItems[k].scrollIntoView({ block: 'start' });
  }

  return { build, start, selectFinding };
})();
