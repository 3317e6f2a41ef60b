// memsnap report, rank page: the head of the page (navigation, rank and window, source, badges)
// and the key numbers (peak, reserved, live at open and close, fragmentation, events, OOM).
'use strict';

window.memsnapRank.header = (function () {
  const M = window.memsnap;
  const { h, arr, obj, num, str, fmtBytes, fmtExactBytes, fmtInt, fmtDur, fmtRel, fmtPct } = M;
  const { D, findings, statsIn, nBands, tMax, batches, ooms, peakT, peakV, bm, bmMethod, bmInferred } = window.memsnapRank;
  const rank = D.rank;
  const runName = str(D.run_name, 'unnamed run');

  // The navigation bar, before <main>.
  function topbar(app) {
    const links = obj(D.links);
    app.append(M.topbar(runName + ' · rank ' + str(rank, '?'), [
      { label: '← All ranks', href: links.index, title: 'cross-rank overview' },
      { label: '‹ Previous window', href: links.prev, title: links.prev ? 'previous window of this rank' : 'no earlier window' },
      { label: 'Next window ›', href: links.next, title: links.next ? 'next window of this rank' : 'no later window' },
    ]));
  }

  // Rank, window, host, device, source, span and the status badges.
  function head(main) {
    const status = str(D.status, 'unknown');
    const badges = h('div', { class: 'badges' }, ...M.statusBadges(status, !!(D.oom || ooms.length), 'OOM' + (ooms.length > 1 ? ' ×' + ooms.length : '')));
    if (num(statsIn.dropped, 0) > 0) badges.append(h('span', { class: 'badge warn' }, fmtInt(statsIn.dropped) + ' events dropped'));
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
        // Labels the record has no value for are left out (an imported snapshot knows no host).
        str(D.host) ? h('span', { class: 'label-host' }, 'host ', h('b', null, str(D.host))) : null,
        str(D.device) ? h('span', { class: 'label-device' }, 'device ', h('b', null, str(D.device))) : null,
        str(D.source) === 'torch'
          ? h('span', { class: 'label-source' }, 'imported from ', h('b', null, str(D.source_file) || 'a PyTorch memory snapshot'))
          : str(D.source) ? h('span', { class: 'label-source' }, 'source ', h('b', null, str(D.source))) : null,
        h('span', null, 'span ', h('b', null, fmtDur(tMax)))),
      badges));
  }

  // The stat tiles, after the findings.
  function stats(main) {
    // What the window kept, compared like with like: from a batch boundary to its close. A window
    // that opened mid-batch (a trace ring buffer's oldest entry, say) opened holding that batch's
    // working memory, so its level at open says nothing of what it kept: the first batch start
    // inside it is the reference then ("-27.1 MiB over the window" on a leaking rank was that).
    const closeNote = (() => {
      const close = num(statsIn.live_at_close), open = num(statsIn.live_at_open);
      if (!isFinite(close)) return { text: null, grew: false };
      const bstats = arr(D.batch_stats).map(obj);
      const first = batches.length ? batches[0] : null;
      let ref = open, text = ' over the window';
      if (first && first.t > 0) {
        const st = bstats.find((b) => num(b.batch) === num(first.batch));
        if (st && isFinite(num(st.live_at_start))) { ref = num(st.live_at_start); text = ' since batch ' + str(first.batch) + ' began (the window opened mid-batch)'; }
      }
      if (!isFinite(ref)) return { text: null, grew: false };
      const leak = findings.find((f) => str(f.kind) === 'leak');
      const delta = close - ref;
      return {
        text: M.fmtSignedBytes(delta) + text + (leak && num(leak.bytes, 0) > 0 ? '; keeps ' + fmtBytes(num(leak.bytes)) + ' per batch (leak)' : ''),
        grew: delta > ref * 0.05 + 1048576 || !!leak,
        delta,
      };
    })();

    const tiles = h('div', { class: 'stats' });
    const pr = num(statsIn.peak_reserved);
    tiles.append(
      M.statTile('Peak allocated', fmtBytes(peakV), isFinite(peakT) ? 'at ' + fmtRel(peakT) : fmtExactBytes(peakV)),
      M.statTile('Peak reserved', fmtBytes(pr), isFinite(pr) && isFinite(peakV) && pr > 0 ? fmtPct(peakV / pr) + ' of it allocated at peak' : null),
      M.statTile('Live at open', fmtBytes(num(statsIn.live_at_open)), 'allocated before the window'),
      M.statTile('Live at close', fmtBytes(num(statsIn.live_at_close)), closeNote.text, closeNote.grew ? 'warn' : null),
      M.statTile('Fragmentation at peak', fmtBytes(num(statsIn.fragmentation_at_peak)), isFinite(pr) && pr > 0 ? fmtPct(num(statsIn.fragmentation_at_peak) / pr) + ' of reserved' : 'reserved but unused'),
      M.statTile('Events', fmtInt(num(statsIn.n_events)), fmtInt(nBands) + ' drawn one by one' + (num(statsIn.dropped, 0) > 0 ? ' · ' + fmtInt(statsIn.dropped) + ' dropped' : ''), num(statsIn.dropped, 0) > 0 ? 'warn' : null));
    if (ooms.length) {
      const o = ooms[0];
      tiles.append(M.statTile('Out of memory: request', fmtBytes(num(o.size)), 'at ' + fmtRel(o.t) + ', ' + fmtBytes(num(o.device_free)) + ' free on device', 'bad'));
    }
    main.append(tiles);
  }

  return { topbar, head, stats };
})();
