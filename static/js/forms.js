/* kvscope forms: a select marked data-autosubmit submits its form when changed (no inline
   handlers: the Content-Security-Policy allows scripts from /static only). */
(function () {
  "use strict";
  document.addEventListener("change", function (evt) {
    var el = evt.target;
    if (el && el.matches && el.matches("select[data-autosubmit]") && el.form) { el.form.submit(); }
  });
})();
