// memsnap report, rank page: one rank's window. Puts the views on the page in their order (head,
// findings, key numbers, timeline, bytes at the peak by stack, allocator state, sites), draws
// them, and runs the self test.
// The views live in rank_*.js (html.cpp loads them, rank_model.js first and this file last).
'use strict';

(function () {
  const M = window.memsnap;
  const R = window.memsnapRank;
  const app = document.getElementById('app');

  R.header.topbar(app);
  const main = M.h('main');
  app.append(main);
  R.header.head(main);
  R.findings.build(main);
  R.header.stats(main);
  R.timeline.build(main);
  R.flame.build(main);
  R.segments.build(main);
  R.sites.build(main);

  R.findings.start();
  R.timeline.start();
  R.flame.start();
  R.segments.start();
  M.ready({ bands: R.nBands, firstDrawMs: R.timeline.firstDrawMs().toFixed(1) });

  // ---- self test (#selftest): drives the UI the way a user would and reports in body[data-selftest]
  if (M.selftest) {
    const results = [];
    const check = (name, fn) => { let ok = false; try { ok = !!fn(); } catch (e) { ok = false; results.push(name + '=error:' + e.message); return; } results.push(name + '=' + (ok ? 'ok' : 'fail')); };
    const fire = (el, type, x, y, extra) => el.dispatchEvent(new MouseEvent(type, Object.assign({ bubbles: true, clientX: x, clientY: y, button: 0 }, extra)));
    R.timeline.selfTest(check, fire);
    R.sites.selfTest(check);
    R.segments.selfTest(check, fire);
    R.timeline.totalsTest(check);
    R.flame.selfTest(check, fire);
    document.body.dataset.selftest = results.join(' ');
  }
})();
