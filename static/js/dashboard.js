/* kvscope dashboard: draws the server-built Plotly figures, drives the range picker and the
   live refresh (paused while the tab is hidden), keeps the charts' time axes in step. */
(function () {
  "use strict";
  var REFRESH_MS = 15000;
  var lastRefresh = Date.now();
  var syncing = false;

  function picker() { return document.getElementById("range-picker"); }

  /* The range sent with every fragment request (hx-vals="js:{...kvscopeRange()}"). */
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

  function draw(el) {
    if (!window.Plotly) { return; }
    var src = document.getElementById(el.dataset.figure);
    if (!src) { return; }
    var fig;
    try { fig = JSON.parse(src.textContent); } catch (e) { el.textContent = "figure unreadable"; return; }
    var isStatic = el.dataset.static === "1";
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
