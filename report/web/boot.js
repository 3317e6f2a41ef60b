// memsnap report: first script of every page. Records any script error where tests and users
// can see it (body[data-error] and a banner), before anything else can fail.
(function () {
  'use strict';
  function record(message) {
    var target = document.body || document.documentElement;
    var text = String(message);
    if (!target.dataset.error) target.dataset.error = text;
    var banner = document.getElementById('memsnap-error');
    if (!banner && document.body) {
      banner = document.createElement('div');
      banner.id = 'memsnap-error';
      banner.className = 'error-banner';
      document.body.insertBefore(banner, document.body.firstChild);
    }
    if (banner) banner.textContent = 'This page hit a script error and may be incomplete: ' + text;
  }
  window.onerror = function (message, source, line, column) {
    record(message + (line ? ' (line ' + line + ':' + column + ')' : ''));
    return false;
  };
  window.addEventListener('unhandledrejection', function (event) {
    record('unhandled rejection: ' + (event.reason && event.reason.message || event.reason));
  });
  window.memsnapRecordError = record;
})();
