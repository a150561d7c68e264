/* Starts Swagger UI on /api/docs with the app's own OpenAPI document (assets served locally). */
(function () {
  "use strict";
  var el = document.getElementById("swagger-ui");
  if (!el || !window.SwaggerUIBundle) { return; }
  window.ui = window.SwaggerUIBundle({
    url: el.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout"
  });
})();
