/* kvscope dashboard: draws the server-built Plotly figures, drives the range picker and the
   live refresh (paused while the tab is hidden), keeps the charts' time axes in step. */
(function () {
  "use strict";
  var REFRESH_MS = 15000;
  var PLOT_MARGIN_PX = 80;  /* the figures' left + right margins */
  var LEGEND_ROW_PX = 19;
  var lastRefresh = Date.now();
  var syncing = false;

  function picker() { return document.getElementById("range-picker"); }

  /* The range sent with every fragment request of an element marked data-range-params (added
     here rather than with hx-vals="js:...", which needs eval and the CSP forbids it). */
  document.addEventListener("htmx:configRequest", function (evt) {
    var el = evt.detail.elt;
    if (!el || !el.closest || !el.closest("[data-range-params]")) { return; }
    var r = window.kvscopeRange();
    Object.keys(r).forEach(function (k) { evt.detail.parameters[k] = r[k]; });
  });

  /* A chart fragment also says how wide its plot is: the server draws at most one point per
     pixel column (and at most 600), so a phone gets a lighter refresh than a wide screen. */
  document.addEventListener("htmx:configRequest", function (evt) {
    var el = evt.detail.elt;
    var chart = el && el.querySelector ? el.querySelector(".chart") : null;
    if (chart && chart.clientWidth > 0) { evt.detail.parameters.px = Math.round(chart.clientWidth - PLOT_MARGIN_PX); }
  });

  window.kvscopeRange = function () {
    var p = picker();
    if (!p) { return {}; }
    if (p.dataset.range === "custom") {
      return { range: "custom", start: p.dataset.start, end: p.dataset.end };
    }
    return { range: p.dataset.range };
  };

  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name);
    return (v && v.trim()) || fallback;
  }

  function themed(layout) {
    var fg = cssVar("--fg", "#1d2330"), grid = cssVar("--border", "#d9dde5");
    layout.font = Object.assign({}, layout.font || {}, { color: fg });
    Object.keys(layout).forEach(function (k) {
      if (/^[xy]axis\d*$/.test(k)) {
        layout[k] = Object.assign({}, layout[k], { gridcolor: grid, linecolor: grid, zerolinecolor: grid });
      }
    });
    if (layout.legend) { layout.legend.font = Object.assign({}, layout.legend.font || {}, { color: fg }); }
    return layout;
  }

  /* Legends that fit: a horizontal legend wraps into rows under the plot; the element grows by
     those rows so the plot keeps its height and no entry is cut off (a phone at 390 px wraps the
     token chart's legend into 3-4 rows). Narrow screens get smaller legend and axis-title fonts. */
  function fitLegend(el, fig) {
    var w = el.clientWidth;
    if (!w) { return; }
    if (!el.dataset.baseH) { el.dataset.baseH = String(el.clientHeight); }
    var base = Number(el.dataset.baseH);
    var narrow = w < 640;
    var charW = narrow ? 5.6 : 6.3;
    var names = fig.data.filter(function (t) { return t.showlegend !== false && t.name; })
      .map(function (t) { return String(t.name).length * charW + 40; });
    var rows = 0, used = w;
    names.forEach(function (px) {
      if (used + px > w) { rows += 1; used = 0; }
      used += px;
    });
    var extra = Math.max(0, rows - 1) * LEGEND_ROW_PX;
    el.style.height = (base + extra) + "px";
    if (narrow) {
      fig.layout.legend = Object.assign({}, fig.layout.legend || {}, { font: { size: 10 } });
      Object.keys(fig.layout).forEach(function (k) {
        var ax = fig.layout[k];
        if (/^yaxis\d*$/.test(k) && ax && ax.title) {
          ax.title = Object.assign({}, ax.title, { font: { size: 10 }, standoff: 2 });
          ax.tickfont = { size: 9 };
        }
      });
    }
  }

  function draw(el) {
    if (!window.Plotly) { return; }
    var src = document.getElementById(el.dataset.figure);
    if (!src) { return; }
    var fig;
    try { fig = JSON.parse(src.textContent); } catch (e) { el.textContent = "figure unreadable"; return; }
    var isStatic = el.dataset.static === "1";
    if (!el.classList.contains("spark")) { fitLegend(el, fig); }
    window.Plotly.react(el, fig.data, themed(fig.layout), {
      responsive: true, displaylogo: false, staticPlot: isStatic,
      modeBarButtonsToRemove: ["lasso2d", "select2d"]
    }).then(function () {
      el.dataset.rendered = "1";
      if (!isStatic && !el.dataset.synced) {
        el.dataset.synced = "1";
        el.on("plotly_relayout", function (ev) { syncAxes(el, ev); });
      }
    });
  }

  function drawAll(force) {
    document.querySelectorAll(".chart[data-figure]").forEach(function (el) {
      if (force || el.dataset.rendered !== "1") { draw(el); }
    });
  }

  /* Zooming one chart zooms the others: one shared time axis. */
  function syncAxes(src, ev) {
    if (syncing || !ev) { return; }
    var upd = null;
    if (ev["xaxis.range[0]"] !== undefined) {
      upd = { "xaxis.range": [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] };
    } else if (ev["xaxis.autorange"]) {
      upd = { "xaxis.autorange": true };
    }
    if (!upd) { return; }
    syncing = true;
    var jobs = [];
    document.querySelectorAll(".chart[data-rendered='1']").forEach(function (el) {
      if (el !== src && el.dataset.static !== "1") { jobs.push(window.Plotly.relayout(el, upd)); }
    });
    Promise.all(jobs).finally(function () { syncing = false; });
  }

  function refresh() {
    lastRefresh = Date.now();
    if (window.htmx) { window.htmx.trigger(document.body, "kvs-refresh"); }
  }

  function setStatus() {
    var s = document.getElementById("live-status");
    if (!s) { return; }
    var p = picker();
    if (p && p.dataset.range === "custom") { s.textContent = "fixed range (no live refresh)"; }
    else if (document.hidden) { s.textContent = "live refresh paused (tab hidden)"; }
    else { s.textContent = "live · every " + REFRESH_MS / 1000 + " s"; }
  }

  function toLocalInput(sec) {
    var d = new Date(sec * 1000);
    d.setMinutes(d.getMinutes() - d.getTimezoneOffset());
    return d.toISOString().slice(0, 16);
  }

  function choose(range, start, end) {
    var p = picker();
    p.dataset.range = range;
    if (start !== undefined) { p.dataset.start = String(start); p.dataset.end = String(end); }
    p.querySelectorAll("button[data-range]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.dataset.range === range ? "true" : "false");
    });
    var q = range === "custom" ? "?range=custom&start=" + p.dataset.start + "&end=" + p.dataset.end : "?range=" + range;
    history.replaceState(null, "", location.pathname + q);
    setStatus();
    refresh();
  }

  function initPicker() {
    var p = picker();
    if (!p) { return; }
    var form = document.getElementById("custom-range");
    form.elements.start.value = toLocalInput(Number(p.dataset.start));
    form.elements.end.value = toLocalInput(Number(p.dataset.end));
    p.querySelectorAll("button[data-range]").forEach(function (b) {
      b.addEventListener("click", function () {
        if (b.dataset.range === "custom") { form.classList.add("open"); return; }
        form.classList.remove("open");
        choose(b.dataset.range);
      });
    });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var s = Date.parse(form.elements.start.value) / 1000, e = Date.parse(form.elements.end.value) / 1000;
      if (!isFinite(s) || !isFinite(e) || s >= e) { form.elements.end.setCustomValidity("end must be after start"); form.reportValidity(); return; }
      form.elements.end.setCustomValidity("");
      choose("custom", Math.floor(s), Math.ceil(e));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    initPicker();
    setStatus();
    drawAll(false);
    document.body.addEventListener("htmx:afterSettle", function () { drawAll(false); });
    setInterval(function () {
      var p = picker();
      if (document.hidden || (p && p.dataset.range === "custom")) { return; }
      if (Date.now() - lastRefresh >= REFRESH_MS - 500) { refresh(); }
    }, 1000);
    document.addEventListener("visibilitychange", function () {
      setStatus();
      if (!document.hidden && Date.now() - lastRefresh >= REFRESH_MS) { refresh(); }
    });
    if (window.matchMedia) {
      window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () { drawAll(true); });
    }
  });
})();
