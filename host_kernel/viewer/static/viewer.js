// host-kernel view: the one script of the pages. It sizes each HTML output's frame to its
// content. The frames are sandboxed without scripts (allow-same-origin only, so this page
// can read their height); nothing in them runs, and this script reads, never writes, them.
"use strict";
(function () {
  function fit(frame) {
    var doc;
    try { doc = frame.contentDocument; } catch (e) { return; }
    if (!doc || !doc.documentElement) { return; }
    frame.style.height = "0px";  // measured at no height: the content's own, not the frame's
    var height = Math.max(doc.documentElement.scrollHeight, doc.body ? doc.body.scrollHeight : 0);
    frame.style.height = Math.ceil(height) + 2 + "px";  // and its 1px borders (border-box)
  }
  function fitAll() {
    document.querySelectorAll("iframe.out.html").forEach(fit);
  }
  document.querySelectorAll("iframe.out.html").forEach(function (frame) {
    frame.addEventListener("load", function () { fit(frame); });
    if (frame.contentDocument && frame.contentDocument.readyState === "complete") { fit(frame); }
  });
  var pending = null;
  window.addEventListener("resize", function () {
    if (pending) { clearTimeout(pending); }
    pending = setTimeout(fitAll, 100);
  });
})();
