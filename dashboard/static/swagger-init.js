/* Swagger UI for the operator API's openapi.json, with the function key the page was opened
 * with (?code=...) sent as x-functions-key on every request, "Try it out" included. */
(function () {
  "use strict";
  const key = new URLSearchParams(location.search).get("code");
  const back = document.getElementById("back");
  if (key) back.setAttribute("href", "/api/dashboard?code=" + encodeURIComponent(key));
  const ui = window.SwaggerUIBundle({
    url: "/api/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    requestInterceptor: function (request) {
      if (key) request.headers["x-functions-key"] = key;
      return request;
    },
    onComplete: function () {
      if (key) ui.preauthorizeApiKey("functionKeyHeader", key);
    },
  });
  window.operatorApiDocs = ui;
})();
