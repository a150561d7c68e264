/* kvscope A/B page: draws the server-built Plotly figures of an experiment. */
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    if (!window.Plotly) { return; }
    document.querySelectorAll("[data-ab-figure]").forEach(function (el) {
      try {
        var fig = JSON.parse(document.getElementById(el.dataset.abFigure).textContent);
        window.Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false, displayModeBar: "hover"});
      } catch (e) { el.textContent = "figure unreadable"; }
    });
  });
})();
