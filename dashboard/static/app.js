/* The operator dashboard: plain JavaScript over the operator HTTP API (/api/...).
 *
 * Every read and action is a call to the operator API, with the function key the page was
 * opened with (?code=...) sent as x-functions-key; the overview also reads
 * /api/dashboard/summary. Nothing stored is ever inserted as HTML: every node is built with
 * createElement and every value set with textContent or as an attribute.
 */
(function () {
  "use strict";

  const KEY = new URLSearchParams(location.search).get("code");
  const REFRESH_MS = 5000;
  const WINDOWS = [
    ["5m", "5 minutes"],
    ["15m", "15 minutes"],
    ["30m", "30 minutes"],
    ["60m", "60 minutes"],
  ];
  const STATES = ["Pending", "Processing", "Compensating", "Error", "Processed"];
  const SORTS = [
    ["index", "Index order (cheapest)"],
    ["-updated", "Updated, newest first"],
    ["updated", "Updated, oldest first"],
    ["-created", "Created, newest first"],
    ["created", "Created, oldest first"],
    ["id", "Order id"],
  ];
  const QUEUE_ROLES_NOTE = "Dead letters are listed per queue role.";
  const LOG_LIMIT = 20;
  const LOG_REFRESH_MS = 15000;
  const app = { me: null, dispose: null, steps: new Set(), renderId: 0 };

  // ------------------------------------------------------------------------------ helpers

  function h(tag, attrs) {
    const node = document.createElement(tag);
    const props = attrs || {};
    for (const key of Object.keys(props)) {
      const value = props[key];
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
      else if (key === "value") node.value = value;
      else if (key === "checked" || key === "disabled" || key === "selected") node[key] = Boolean(value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (let i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }

  function append(node) {
    for (let i = 1; i < arguments.length; i++) {
      const child = arguments[i];
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) {
        for (const c of child) append(node, c);
        continue;
      }
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function hashLink(hash, text, attrs) {
    return h("a", Object.assign({ href: hash }, attrs || {}), text);
  }

  function badge(text) {
    return h("span", { class: "badge " + String(text || "").replace(/[^A-Za-z_-]/g, "") }, text || "—");
  }

  function pageUrl(path) {
    return path + (KEY ? "?code=" + encodeURIComponent(KEY) : "");
  }

  function fmtTime(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (isNaN(d)) return String(iso);
    const today = new Date();
    const time = d.toLocaleTimeString([], { hour12: false });
    return d.toDateString() === today.toDateString() ? time : d.toLocaleDateString() + " " + time;
  }

  function ago(iso) {
    if (!iso) return "";
    const s = (Date.now() - Date.parse(iso)) / 1000;
    if (isNaN(s)) return "";
    if (s < 0) return "in " + dur(-s);
    return dur(s) + " ago";
  }

  function dur(s) {
    if (s === null || s === undefined || isNaN(s)) return "—";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 90) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + " s";
    if (s < 5400) return (s / 60).toFixed(1) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }

  function timeCell(iso) {
    return h("td", { title: iso || "" }, fmtTime(iso), h("div", { class: "muted small" }, ago(iso)));
  }

  function num(value) {
    return value === null || value === undefined ? "—" : String(value);
  }

  function clear(node) {
    node.replaceChildren();
    return node;
  }

  function notify(kind, message) {
    const box = document.getElementById("notices");
    const note = h("div", { class: "notice " + kind, role: kind === "bad" ? "alert" : "status" },
      h("span", {}, message),
      h("button", { type: "button", "aria-label": "Dismiss", onclick: () => note.remove() }, "✕"));
    box.prepend(note);
    while (box.children.length > 4) box.lastChild.remove();
    if (kind === "ok") setTimeout(() => note.remove(), 12000);
  }

  async function api(path, options) {
    const opts = options || {};
    const headers = { Accept: "application/json" };
    if (KEY) headers["x-functions-key"] = KEY;
    let body;
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.body);
    }
    const response = await fetch("/api/" + path, {
      method: opts.method || "GET",
      headers: headers,
      body: body,
      signal: opts.signal,
      credentials: "same-origin",
      cache: "no-store",
    });
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok) {
      const error = (data && data.error) || {};
      const failure = new Error(error.message || "HTTP " + response.status);
      failure.status = response.status;
      failure.code = error.code || "http_" + response.status;
      throw failure;
    }
    return { status: response.status, data: data };
  }

  function describe(error) {
    if (error && error.name === "AbortError") return "";
    const code = error && error.code ? " (" + error.code + ")" : "";
    return (error && error.message ? error.message : String(error)) + code;
  }

  function query(params) {
    const search = new URLSearchParams();
    for (const key of Object.keys(params)) {
      const value = params[key];
      if (value !== null && value !== undefined && value !== "") search.set(key, value);
    }
    const text = search.toString();
    return text ? "?" + text : "";
  }

  /** Run ``task`` now and every ``ms`` after it ends, while the page is visible. */
  function every(ms, task) {
    let timer = null;
    let stopped = false;
    const run = async () => {
      timer = null;
      if (stopped) return;
      if (!document.hidden) {
        try {
          await task();
        } catch (error) {
          const text = describe(error);
          if (text) notify("bad", text);
        }
      }
      if (!stopped) timer = setTimeout(run, ms);
    };
    run();
    return () => {
      stopped = true;
      if (timer) clearTimeout(timer);
    };
  }

  // ------------------------------------------------------------------------------- dialog

  /**
   * Ask before an action: a title, what it does, a reason (required unless reason is false),
   * and optional extra fields. Resolves to {reason, ...extra values} or null when cancelled.
   */
  function ask(spec) {
    const dialog = document.getElementById("dialog");
    clear(dialog);
    return new Promise((resolve) => {
      const form = h("form", { method: "dialog" });
      const reasonBox = h("textarea", { name: "reason", maxlength: "1024", "data-testid": "reason", placeholder: "Why? It is recorded with your name." });
      if (spec.reason !== false) reasonBox.required = true;
      const confirm = h("button", { type: "submit", class: spec.danger ? "danger" : "primary", "data-testid": "confirm" }, spec.confirm || "Confirm");
      const cancel = h("button", { type: "button", "data-testid": "cancel" }, "Cancel");
      const extras = spec.fields || [];
      append(form, h("h2", { id: "dialog-title" }, spec.title));
      append(form, spec.body || []);
      for (const field of extras) append(form, h("label", { class: "field" }, field.label, field.input));
      if (spec.reason !== false) append(form, h("label", { class: "field" }, "Reason", reasonBox));
      if (spec.note) append(form, h("p", { class: "muted small" }, spec.note));
      if (app.me && !app.me.can_act) {
        confirm.disabled = true;
        append(form, h("p", { class: "error-text" }, "You are not signed in: the API refuses actions without a signed-in caller."));
      }
      append(form, h("div", { class: "buttons" }, cancel, confirm));
      dialog.appendChild(form);
      let settled = false;
      const finish = (value) => {
        if (settled) return;
        settled = true;
        if (dialog.open) dialog.close();
        resolve(value);
      };
      cancel.addEventListener("click", () => finish(null));
      dialog.addEventListener("cancel", () => finish(null), { once: true });
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        if (spec.reason !== false && !reasonBox.value.trim()) {
          reasonBox.focus();
          return;
        }
        const values = { reason: reasonBox.value.trim() };
        for (const field of extras) values[field.name] = field.input.value;
        finish(values);
      });
      dialog.showModal();
      (spec.reason !== false ? reasonBox : confirm).focus();
    });
  }

  // ------------------------------------------------------------------------------- caller

  async function loadMe() {
    const who = clear(document.getElementById("who"));
    try {
      app.me = (await api("dashboard/me")).data;
    } catch (error) {
      app.me = { can_act: false, principal: null };
      append(who, h("span", { class: "error-text" }, "caller unknown: " + describe(error)));
      return;
    }
    const me = app.me;
    if (me.principal) {
      append(who, "acting as ", h("strong", { "data-testid": "principal" }, me.principal));
      if (me.has_operator_role === false) {
        append(who, " ", h("span", { class: "badge warning", title: "Actions need the " + me.operator_role + " app role" }, "no " + me.operator_role + " role"));
      }
      if (me.sign_out) append(who, " · ", h("a", { href: me.sign_out }, "sign out"));
    } else if (me.sign_in) {
      const back = location.pathname + location.search + location.hash;
      append(who, "read only · ", h("a", { href: me.sign_in + "?post_login_redirect_uri=" + encodeURIComponent(back) }, "sign in to act"));
    } else {
      append(who, h("span", { title: "The API refuses actions without a signed-in caller (X-MS-CLIENT-PRINCIPAL-NAME)" }, "read only: nobody signed in"));
    }
  }

  function actionButton(label, handler, attrs) {
    const button = h("button", Object.assign({ type: "button" }, attrs || {}), label);
    if (app.me && !app.me.can_act) {
      button.disabled = true;
      button.title = "Sign in to act: the API records who acted";
    }
    button.addEventListener("click", handler);
    return button;
  }

  // ------------------------------------------------------------------------------- charts

  function uplotChart(holder, title, series, data, axes) {
    const width = Math.max(360, holder.clientWidth - 4 || 600);
    const options = {
      title: title,
      width: width,
      height: 220,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true } },
      series: [{}].concat(series),
      axes: axes || [{}, {}],
      legend: { live: true },
    };
    clear(holder);
    if (typeof window.uPlot !== "function") {
      append(holder, h("p", { class: "error-text" }, "the chart library did not load"));
      return null;
    }
    return new window.uPlot(options, data, holder);
  }

  function seriesStyle(label, stroke, extra) {
    return Object.assign({ label: label, stroke: stroke, width: 2, spanGaps: false, points: { show: true, size: 4 } }, extra || {});
  }

  // ----------------------------------------------------------------------------- overview

  function viewOverview(root, params) {
    const windowParam = WINDOWS.some((w) => w[0] === params.window) ? params.window : "15m";
    const select = h("select", { "data-testid": "window", onchange: () => (location.hash = "#/overview" + query({ window: select.value })) },
      WINDOWS.map((w) => h("option", { value: w[0], selected: w[0] === windowParam }, w[1])));
    const stamp = h("span", { class: "muted small", "data-testid": "updated" });
    const cards = h("div", { class: "cards", "data-testid": "cards" });
    const throughput = h("div", { class: "chart panel", "data-testid": "chart-throughput" });
    const latency = h("div", { class: "chart panel", "data-testid": "chart-latency" });
    const history = h("div", { class: "chart panel", "data-testid": "chart-history" });
    const details = h("div", { class: "row" });
    append(root,
      h("div", { class: "toolbar" }, h("h1", {}, "Overview"), h("span", { class: "spacer" }), h("label", {}, "Window", select), stamp),
      cards,
      h("div", { class: "charts" }, throughput, latency, history),
      details);
    const charts = {};

    async function refresh() {
      const summary = (await api("dashboard/summary?window=" + windowParam)).data;
      renderCards(cards, summary);
      renderCharts(summary);
      renderDetails(details, summary);
      stamp.textContent = "updated " + fmtTime(summary.generated_at) + " · every " + REFRESH_MS / 1000 + " s";
    }

    function renderCharts(summary) {
      const finished = summary.finished || {};
      const buckets = finished.buckets || [];
      const xs = buckets.map((b) => Date.parse(b.start) / 1000);
      const errorsPer = (summary.errors || {}).per_bucket || buckets.map(() => null);
      const bucket = summary.bucket_s;
      const tData = [xs, buckets.map((b) => b.processed), errorsPer.slice(0, xs.length), buckets.map((b) => b.retries)];
      const lData = [xs, buckets.map((b) => b.p50_s), buckets.map((b) => b.p99_s)];
      const hist = summary.history || [];
      const hData = [hist.map((p) => Date.parse(p.at) / 1000), hist.map((p) => p.in_flight), hist.map((p) => p.errors), hist.map((p) => p.lag_s)];
      update("throughput", throughput, "Finished per " + bucket + " s" + (finished.partial ? " (partial: more than read)" : ""), [
        seriesStyle("Processed", "#1f8a4c", { fill: "rgba(31,138,76,0.12)" }),
        seriesStyle("Entered Error", "#c53030"),
        seriesStyle("Retried requests", "#b7791f", { dash: [4, 3] }),
      ], tData);
      update("latency", latency, "Latency, created to Processed (s)", [
        seriesStyle("p50", "#2457c5"),
        seriesStyle("p99", "#7b4bb7"),
      ], lData);
      update("history", history, "In flight, Error, Supervisor lag (since " + fmtTime(summary.tracking_since) + ")", [
        seriesStyle("In flight", "#2457c5"),
        seriesStyle("Error", "#c53030"),
        seriesStyle("Supervisor lag (s)", "#d97706", { scale: "s" }),
      ], hData, [{}, {}, { side: 1, scale: "s", grid: { show: false } }]);
    }

    function update(name, holder, title, series, data, axes) {
      const existing = charts[name];
      if (existing && existing.title === title && existing.chart) {
        existing.chart.setData(data);
        return;
      }
      if (existing && existing.chart) existing.chart.destroy();
      charts[name] = { title: title, chart: uplotChart(holder, title, series, data, axes) };
    }

    const stop = every(REFRESH_MS, refresh);
    return () => {
      stop();
      for (const name of Object.keys(charts)) if (charts[name].chart) charts[name].chart.destroy();
    };
  }

  function card(label, value, hint, hash, tone, testid) {
    const body = [h("div", { class: "label" }, label), h("div", { class: "value" }, value), h("div", { class: "hint" }, hint || "")];
    const attrs = { class: "card" + (tone ? " " + tone : ""), "data-testid": testid || null };
    return hash ? h("a", Object.assign({ href: hash }, attrs), body) : h("div", attrs, body);
  }

  function failed(part) {
    if (part && part.pending) return "reading…";
    return part && part.error ? "unavailable: " + part.error : null;
  }

  function unknown(part) {
    return !part || part.error || part.pending;
  }

  function renderCards(cards, s) {
    const active = s.in_flight || {};
    const errors = s.errors || {};
    const finished = s.finished || {};
    const sup = s.supervisor || {};
    const alerts = s.alerts || {};
    const dead = s.dead_letters || {};
    const by = active.by_state || {};
    const est = active.estimated ? "estimated from " + active.read + " read" : active.error ? failed(active) : "now";
    const lagTone = sup.lag_s > (sup.detection_s || Infinity) ? "bad" : sup.lag_s > (sup.period_s || Infinity) ? "warn" : "ok";
    clear(cards);
    append(cards, [
      card("Pending (waiting to retry)", num(by.Pending), est, "#/orders?state=Pending", by.Pending ? "warn" : "", "card-Pending"),
      card("Processing", num(by.Processing), est, "#/orders?state=Processing", "", "card-Processing"),
      card("Compensating", num(by.Compensating), est, "#/orders?state=Compensating", by.Compensating ? "warn" : "", "card-Compensating"),
      card("In flight", num(active.total), (active.overdue || 0) + " due for the Supervisor" + (active.partial ? " · partial" : ""), "#/orders?state=Processing", "", "card-in-flight"),
      card("Error", num(errors.total), failed(errors) || (errors.in_window || 0) + " in the window", "#/orders?state=Error", errors.total ? "bad" : "ok", "card-Error"),
      card("Processed", num(finished.processed), failed(finished) || "in the window" + (finished.partial ? " (partial)" : ""), "#/orders?state=Processed&sort=-updated", "ok", "card-Processed"),
      card("Throughput", finished.orders_per_s_5m === undefined ? "—" : finished.orders_per_s_5m + "/s", "Processed, last 5 min", null, "", "card-throughput"),
      card("Latency p50 / p99", finished.p50_s === undefined || finished.p50_s === null ? "—" : dur(finished.p50_s) + " / " + dur(finished.p99_s), "created to Processed", null, "", "card-latency"),
      card("Retries", num(finished.retries), (finished.recovered || 0) + " Processed orders needed them", null, finished.retries ? "warn" : "", "card-retries"),
      card("Supervisor lag", sup.lag_s === undefined ? "—" : dur(sup.lag_s), failed(sup) || "bound " + dur(sup.detection_s), "#/supervisor", sup.error ? "bad" : lagTone, "card-lag"),
      card("Open alerts", unknown(alerts) ? "…" : num((alerts.open || 0) + (alerts.retrying || 0)), failed(alerts) || (alerts.retrying || 0) + " retrying" + (alerts.more ? " · more" : ""), "#/alerts", alerts.open ? "bad" : "ok", "card-alerts"),
      card("Dead letters", unknown(dead) ? "…" : num(dead.total) + (dead.more ? "+" : ""), failed(dead) || "all queues", "#/dead-letters", dead.total ? "bad" : "ok", "card-dead-letters"),
    ]);
  }

  function renderDetails(root, s) {
    const errors = s.errors || {};
    const causes = errors.causes || {};
    const dead = s.dead_letters || {};
    const causeRows = Object.keys(causes).sort().map((c) => h("tr", {}, h("td", {}, c), h("td", { class: "num" }, causes[c])));
    const deadRows = (dead.queues || []).map((q) =>
      h("tr", {}, h("td", {}, hashLink("#/dead-letters/" + encodeURIComponent(q.queue), q.queue)), h("td", { class: "num" }, q.count + (q.more ? "+" : ""))));
    clear(root);
    append(root,
      h("div", { class: "panel grow" }, h("h2", {}, "Errors in the window, by cause"),
        causeRows.length ? h("table", {}, h("tbody", {}, causeRows)) : h("p", { class: "muted" }, "No order entered Error in the window."),
        h("p", { class: "muted small" }, "Compensations now: " + num(((s.in_flight || {}).by_state || {}).Compensating) + ". Causes read for the latest " + num(errors.causes_read) + " Error orders.")),
      h("div", { class: "panel grow" }, h("h2", {}, "Dead letters by queue"),
        unknown(dead) ? h("p", { class: "muted" }, failed(dead) || "") : h("table", {}, h("tbody", {}, deadRows))),
      h("div", { class: "panel grow" }, h("h2", {}, "Agents' circuits"), circuitsPanel(s.circuits),
        h("p", { class: "muted small", "data-testid": "circuits" }, s.circuits_note || "")));
  }

  function circuitsPanel(part) {
    if (unknown(part)) return h("p", { class: "muted", "data-testid": "circuits-error" }, failed(part) || "reading…");
    const rows = (part.agents || []).map((a) => {
      const shown = a.state || "closed";
      const counts = Object.keys(a.by_state || {}).sort().map((k) => a.by_state[k] + " " + k).join(", ");
      const detail = a.state === null
        ? "no transition reported"
        : a.state === "open"
          ? "retry " + (a.retry_at ? ago(a.retry_at) : "—") + " · " + a.consecutive_failures + " failures"
          : counts;
      return h("tr", { "data-testid": "circuit-row", "data-agent": a.agent, "data-state": shown },
        h("td", {}, a.agent),
        h("td", {}, badge(shown)),
        h("td", { title: a.since || "" }, a.since ? ago(a.since) : "—"),
        h("td", { class: "num" }, num(a.instances)),
        h("td", { class: "num" }, a.stale ? a.stale + " stale" : "—"),
        h("td", { class: "muted small" }, detail));
    });
    return h("table", { "data-testid": "circuits-table" },
      h("thead", {}, h("tr", {}, ["Agent", "State", "Since", "Instances", "Stale", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows));
  }

  // ------------------------------------------------------------------------------- orders

  function viewOrders(root, params) {
    const stateValue = STATES.includes(params.state) ? params.state : "Error";
    const field = (name, attrs) => h("input", Object.assign({ name: name, value: params[name] || "" }, attrs));
    const stateSelect = h("select", { name: "state", "data-testid": "filter-state" }, STATES.map((s) => h("option", { value: s, selected: s === stateValue }, s)));
    const stepList = h("datalist", { id: "known-steps" }, Array.from(app.steps).sort().map((s) => h("option", { value: s })));
    const step = field("step", { list: "known-steps", placeholder: "any", size: 16, "data-testid": "filter-step" });
    const older = field("older_than", { placeholder: "e.g. 15m", size: 7, "data-testid": "filter-older" });
    const newer = field("newer_than", { placeholder: "e.g. 2h", size: 7, "data-testid": "filter-newer" });
    const text = field("text", { placeholder: "id, error or reason", size: 22, "data-testid": "filter-text" });
    const sort = h("select", { name: "sort", "data-testid": "filter-sort" }, SORTS.map((s) => h("option", { value: s[0], selected: s[0] === (params.sort || "index") }, s[1])));
    const limit = h("select", { name: "limit" }, ["20", "50", "100"].map((n) => h("option", { value: n, selected: n === (params.limit || "50") }, n)));
    const live = h("input", { type: "checkbox", "data-testid": "live", checked: sessionStorage.getItem("orders-live") !== "off" });
    const form = h("form", { class: "toolbar", "data-testid": "order-filters" },
      h("label", {}, "State", stateSelect), h("label", {}, "Step", step, stepList), h("label", {}, "Older than", older),
      h("label", {}, "Newer than", newer), h("label", {}, "Text", text), h("label", {}, "Sort", sort), h("label", {}, "Per page", limit),
      h("button", { type: "submit", class: "primary", "data-testid": "apply-filters" }, "Apply"),
      h("label", { class: "check" }, live, "Live"));
    const info = h("div", { class: "muted small", "data-testid": "orders-info" });
    const tableHolder = h("div", { class: "table-wrap" });
    const pager = h("div", { class: "pager" });
    const bulk = h("div", { class: "actions" });
    append(root, h("h1", {}, "Orders"), form, h("div", { class: "toolbar" }, bulk, h("span", { class: "spacer" }), info), tableHolder, pager);

    const current = {
      state: stateValue, step: params.step, older_than: params.older_than, newer_than: params.newer_than,
      text: params.text, sort: params.sort && params.sort !== "index" ? params.sort : null, limit: params.limit,
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = "#/orders" + query({
        state: stateSelect.value, step: step.value.trim(), older_than: older.value.trim(), newer_than: newer.value.trim(),
        text: text.value.trim(), sort: sort.value === "index" ? "" : sort.value, limit: limit.value === "50" ? "" : limit.value,
      });
    });
    live.addEventListener("change", () => sessionStorage.setItem("orders-live", live.checked ? "on" : "off"));

    const filters = () => ({ state: current.state, step: current.step, older_than: current.older_than, newer_than: current.newer_than, text: current.text });
    if (current.state === "Error") append(bulk, actionButton("Resubmit all matching…", () => bulkAction("resubmit", filters()), { "data-testid": "bulk-resubmit" }));
    if (current.state === "Pending" || current.state === "Processing") {
      append(bulk, actionButton("Cancel all matching…", () => bulkAction("cancel", filters()), { class: "danger", "data-testid": "bulk-cancel" }));
    }

    async function load() {
      const page = (await api("orders" + query(Object.assign({}, current, { continuation: params.c })))).data;
      for (const item of page.items) if (item.current_step) app.steps.add(item.current_step);
      info.textContent = page.items.length + " shown · " + page.scanned + " rows looked at" + (page.partial ? " · partial: the sort covers only the rows read, narrow the filter" : "");
      renderOrderTable(tableHolder, page.items);
      clear(pager);
      if (params.c) append(pager, hashLink("#/orders" + query(Object.assign({}, current, { c: null })), "« First page"));
      if (page.continuation) {
        append(pager, hashLink("#/orders" + query(Object.assign({}, current, { c: page.continuation })), "Next page »", { "data-testid": "next-page" }));
      } else {
        append(pager, h("span", { class: "muted small" }, "end of the listing"));
      }
    }

    let stop = null;
    const restart = () => {
      if (stop) stop();
      stop = live.checked ? every(REFRESH_MS, load) : null;
      if (!live.checked) load().catch((error) => notify("bad", describe(error)));
    };
    live.addEventListener("change", restart);
    restart();
    return () => {
      if (stop) stop();
    };
  }

  function renderOrderTable(holder, items) {
    clear(holder);
    if (!items.length) {
      append(holder, h("div", { class: "empty", "data-testid": "no-orders" }, "No orders match on this page."));
      return;
    }
    const rows = items.map((o) =>
      h("tr", { "data-testid": "order-row", "data-order-id": o.order_id },
        h("td", { class: "mono" }, hashLink("#/order/" + encodeURIComponent(o.order_id), o.order_id)),
        h("td", {}, badge(o.state)),
        h("td", {}, o.current_step || "—", h("div", { class: "muted small" }, o.current_operation || "")),
        h("td", { class: "num" }, num(o.attempt)),
        h("td", { class: "num" }, num(o.failure_count)),
        h("td", { class: "num" }, num(o.generation)),
        timeCell(o.created_at),
        timeCell(o.updated_at),
        h("td", { class: "clip", title: o.last_error || o.compensation_reason || "" }, o.last_error || o.compensation_reason || "")));
    append(holder, h("table", { "data-testid": "orders-table" },
      h("thead", {}, h("tr", {}, ["Order", "State", "Step", "Requests", "Failures", "Gen.", "Created", "Updated", "Last error / reason"].map((t, i) => h("th", { class: i >= 3 && i <= 5 ? "num" : "" }, t)))),
      h("tbody", {}, rows)));
  }

  async function bulkAction(action, filters) {
    let preview;
    try {
      preview = (await api("bulk/" + action, { method: "POST", body: Object.assign({ dry_run: true }, filters) })).data;
    } catch (error) {
      notify("bad", action + ": " + describe(error));
      return;
    }
    const selected = preview.items.filter((i) => i.outcome === "would_" + action);
    const list = h("div", { class: "preview" }, h("table", {}, h("tbody", {}, preview.items.map((i) =>
      h("tr", {}, h("td", { class: "mono" }, i.order_id), h("td", {}, badge(i.outcome)), h("td", {}, i.detail || ""))))));
    const answer = await ask({
      title: (action === "resubmit" ? "Resubmit " : "Cancel ") + selected.length + " order(s)",
      body: [h("p", {}, "These orders match now" + (preview.more ? " (more match: run it again afterwards)" : "") + ". Each is read again and acted on only if it still matches."), list],
      confirm: action === "resubmit" ? "Resubmit them" : "Cancel them",
      danger: action === "cancel",
    });
    if (!answer || !selected.length) return;
    try {
      const done = (await api("bulk/" + action, { method: "POST", body: Object.assign({}, filters, { reason: answer.reason, order_ids: selected.map((i) => i.order_id) }) })).data;
      notify("ok", action + ": acted on " + done.acted + " of " + done.items.length + " order(s)");
    } catch (error) {
      notify("bad", action + ": " + describe(error));
    }
  }

  // -------------------------------------------------------------------------------- order

  function viewOrder(root, params, orderId) {
    const head = h("div");
    const ganttHolder = h("div", { class: "panel" });
    const stepsHolder = h("div", { class: "panel" });
    const traceHolder = h("div", { class: "panel", "data-testid": "trace-panel" });
    const timelineHolder = h("div", { class: "panel" });
    const submittedHolder = h("div", { class: "panel" });
    append(root, head, ganttHolder, stepsHolder, traceHolder, timelineHolder, submittedHolder);
    const controller = new AbortController();
    let detail = null;
    let stopped = false;
    let spans = null;
    let spansAt = 0;
    let spansLoading = false;

    async function loadTrace(force) {
      if (spansLoading || stopped || (!force && Date.now() - spansAt < 3000)) return;
      spansLoading = true;
      try {
        spans = (await api("dashboard/orders/" + encodeURIComponent(orderId) + "/trace", { signal: controller.signal })).data;
      } catch (error) {
        const text = describe(error);
        spans = text ? { failed: text } : spans;
      } finally {
        spansAt = Date.now();
        spansLoading = false;
      }
      if (detail && !stopped) renderTrace(traceHolder, detail, spans, () => loadTrace(true));
    }

    async function loadAll() {
      let page = (await api("orders/" + encodeURIComponent(orderId) + "?timeline_limit=1000", { signal: controller.signal })).data;
      const timeline = page.timeline.slice();
      while (page.timeline_continuation !== null && page.timeline_continuation !== undefined) {
        const more = (await api("orders/" + encodeURIComponent(orderId) + "?timeline_limit=1000&timeline_after=" + page.timeline_continuation, { signal: controller.signal })).data;
        timeline.push.apply(timeline, more.timeline);
        page = more;
      }
      return Object.assign({}, page, { timeline: timeline });
    }

    function draw() {
      for (const s of detail.steps) app.steps.add(s.name);
      renderOrderHead(head, detail, refreshNow);
      renderGantt(ganttHolder, detail);
      renderSteps(stepsHolder, detail);
      renderTrace(traceHolder, detail, spans, () => loadTrace(true));
      loadTrace(false);
      renderTimeline(timelineHolder, detail.timeline);
      clear(submittedHolder);
      append(submittedHolder, h("h2", {}, "As submitted"), h("pre", { "data-testid": "submitted" }, JSON.stringify(detail.submitted, null, 2)));
    }

    async function refreshNow() {
      detail = await loadAll();
      draw();
      watch();
    }

    let watching = false;
    async function watch() {
      if (watching || stopped) return;
      watching = true;
      try {
        while (!stopped && detail && !["Processed", "Error"].includes(detail.order.state)) {
          if (document.hidden) {
            await new Promise((resolve) => setTimeout(resolve, 1000));
            continue;
          }
          const after = detail.timeline.length ? detail.timeline[detail.timeline.length - 1].seq : -1;
          const seen = (await api("orders/" + encodeURIComponent(orderId) + "/watch?after=" + after + "&wait=20", { signal: controller.signal })).data;
          if (seen.changed) {
            const known = new Set(detail.timeline.map((e) => e.seq));
            const merged = detail.timeline.concat(seen.detail.timeline.filter((e) => !known.has(e.seq)));
            detail = Object.assign({}, seen.detail, { timeline: merged });
          } else {
            detail = Object.assign({}, seen.detail, { timeline: detail.timeline });
          }
          draw();
        }
      } catch (error) {
        const text = describe(error);
        if (text && !stopped) notify("bad", "watching " + orderId + ": " + text);
      } finally {
        watching = false;
      }
    }

    refreshNow().catch((error) => {
      const text = describe(error);
      if (text) {
        clear(head);
        append(head, h("h1", {}, "Order ", h("span", { class: "mono" }, orderId)), h("p", { class: "error-text", "data-testid": "order-error" }, text));
      }
    });
    return () => {
      stopped = true;
      controller.abort();
    };
  }

  function renderOrderHead(root, detail, reload) {
    const o = detail.order;
    const trace = o.trace_id || detail.trace_id || null;
    const facts = [
      ["Workflow", o.workflow], ["Generation", o.generation], ["Requests sent", o.attempt], ["Failures (this step)", o.failure_count],
      ["Current step", (o.current_step || "—") + " (" + (o.current_operation || "") + ")"], ["Locked by", o.locked_by || "—"],
      ["Complete by", o.complete_by ? fmtTime(o.complete_by) + " (" + ago(o.complete_by) + ")" : "—"],
      ["Next attempt", o.next_attempt_at ? fmtTime(o.next_attempt_at) + " (" + ago(o.next_attempt_at) + ")" : "—"],
      ["Created", fmtTime(o.created_at) + " (" + ago(o.created_at) + ")"], ["Updated", fmtTime(o.updated_at) + " (" + ago(o.updated_at) + ")"],
      ["Last error", o.last_error || "—"], ["Compensation", o.compensation_cause ? o.compensation_cause + ": " + (o.compensation_reason || "") : "—"],
      ["Compensating since", o.compensating_since ? fmtTime(o.compensating_since) + " (" + ago(o.compensating_since) + ")" : "—"],
      ["Reply queue", o.reply_to || "—"], ["Trace id", trace || "not recorded on the order"],
    ];
    if (o.state === "Error") {
      const open = o.settling || [];
      facts.push(["Settling", open.length ? "yes: an answer may still change " + open.join(", ") : "no: settled, only an operator changes it now"]);
    }
    const actions = h("div", { class: "actions" });
    const id = o.order_id;
    if (o.state === "Error") {
      append(actions, actionButton("Resubmit…", () => orderAction(id, "resubmit", reload), { class: "primary", "data-testid": "resubmit" }));
      append(actions, actionButton("Restart from a step…", () => restartAction(detail, reload), { "data-testid": "restart" }));
    }
    if (o.state === "Pending" || o.state === "Processing") {
      append(actions, actionButton("Cancel…", () => orderAction(id, "cancel", reload), { class: "danger", "data-testid": "cancel-order" }));
    }
    clear(root);
    append(root,
      h("div", { class: "toolbar" }, h("h1", {}, "Order ", h("span", { class: "mono", "data-testid": "order-id" }, id), " ", h("span", { "data-testid": "order-state" }, badge(o.state))),
        h("span", { class: "spacer" }), actions),
      h("div", { class: "panel" }, h("dl", { class: "facts" }, facts.map((f) => [h("dt", {}, f[0]), h("dd", {}, String(f[1]))]))));
  }

  async function orderAction(orderId, action, reload) {
    const answer = await ask({
      title: (action === "resubmit" ? "Resubmit " : "Cancel ") + orderId,
      body: [h("p", {}, action === "resubmit"
        ? "The order resumes at the first step not done (next generation), or resumes its compensation."
        : "Every step that may have taken effect, the one in flight too, is undone; then Error 'cancelled'.")],
      confirm: action === "resubmit" ? "Resubmit" : "Cancel the order",
      danger: action === "cancel",
    });
    if (!answer) return;
    try {
      const done = (await api("orders/" + encodeURIComponent(orderId) + "/" + action, { method: "POST", body: { reason: answer.reason } })).data;
      notify("ok", orderId + ": " + done.outcome + " (" + done.state + ", generation " + done.generation + ")");
      await reload();
    } catch (error) {
      notify("bad", orderId + ": " + describe(error));
    }
  }

  async function restartAction(detail, reload) {
    const select = h("select", { "data-testid": "restart-step" }, detail.steps.map((s) => h("option", { value: s.name }, s.name + " (" + s.state + ")")));
    const answer = await ask({
      title: "Restart " + detail.order.order_id + " from a step",
      body: [h("p", {}, "That step and every later one are redone with new idempotency keys; the steps before it keep what succeeded.")],
      fields: [{ name: "step", label: "From step", input: select }],
      confirm: "Restart",
    });
    if (!answer) return;
    try {
      const done = (await api("orders/" + encodeURIComponent(detail.order.order_id) + "/restart", { method: "POST", body: { step: answer.step, reason: answer.reason } })).data;
      notify("ok", detail.order.order_id + ": " + done.outcome + " from " + answer.step);
      await reload();
    } catch (error) {
      notify("bad", detail.order.order_id + ": " + describe(error));
    }
  }

  function renderGantt(root, detail) {
    clear(root);
    append(root, h("h2", {}, "Timeline"));
    const model = window.Gantt.build(detail, Date.now());
    const wrap = h("div", { class: "gantt-wrap" });
    append(root, wrap);
    const width = Math.max(600, root.clientWidth - 30);
    wrap.appendChild(window.Gantt.render(model, { width: width, now: Date.now() }));
    const span = model.end - model.start;
    append(root,
      h("div", { class: "legend" },
        [["succeeded", "request answered"], ["retry", "failed or deferred attempt"], ["declined", "declined or cancelled"], ["undo", "undo (compensation)"], ["running", "in flight"], ["wait", "waiting to retry"], ["operator", "operator action"], ["supervisor", "Supervisor action"]]
          .map((l) => h("span", {}, h("span", { class: "swatch " + l[0] }), l[1])),
        h("span", {}, "span " + window.Gantt.seconds(span) + " · " + model.bars.length + " requests")));
  }

  // The order's spans (dashboard/traces.py): a collapsible tree per trace, each span with its
  // duration and a bar placed on the trace's time axis. Names and attributes are text.
  function renderTrace(root, detail, data, reload) {
    clear(root);
    const traceId = detail.trace_id || detail.order.trace_id || null;
    append(root,
      h("div", { class: "toolbar" }, h("h2", {}, "Trace"), h("span", { class: "spacer" }),
        h("button", { type: "button", "data-testid": "trace-refresh", onclick: reload }, "Refresh")),
      h("p", {}, "Trace id ", h("span", { class: "mono", "data-testid": "trace-id" }, traceId || "not recorded on the order")));
    if (!data) {
      append(root, h("p", { class: "muted" }, "Loading the spans…"));
      return;
    }
    if (data.failed) {
      append(root, h("p", { class: "error-text", "data-testid": "trace-hint" }, "The spans could not be read: " + data.failed));
      return;
    }
    if (!data.local) {
      append(root, h("p", { "data-testid": "trace-hint" }, traceId
        ? "Search " + traceId + " as the operation id in Application Insights (Transaction search): intake, every agent and reply, the Supervisor's recovery and operator actions are all in that one trace."
        : data.hint));
      return;
    }
    if (data.hint) append(root, h("p", { class: "muted", "data-testid": "trace-hint" }, data.hint));
    if (data.truncated) append(root, h("p", { class: "muted small" }, "The first " + countSpans(data.traces) + " of " + data.span_count + " spans; `orderctl trace " + detail.order.order_id + "` prints them all."));
    for (const t of data.traces) {
      const total = Math.max(t.duration_ms, 0.001);
      append(root, h("div", { class: "trace", "data-testid": "trace-tree", "data-trace-id": t.trace_id },
        h("div", { class: "muted small" }, "trace ", h("span", { class: "mono" }, t.trace_id), " · " + dur(t.duration_ms / 1000) + (t.why ? " · a trace of its own: " + t.why : "")),
        h("ul", { class: "trace-tree" }, t.spans.map((s) => traceSpan(s, total)))));
    }
  }

  function countSpans(traces) {
    let n = 0;
    const walk = (s) => { n += 1; s.children.forEach(walk); };
    traces.forEach((t) => t.spans.forEach(walk));
    return n;
  }

  function traceSpan(s, total) {
    const fill = h("span", { class: "trace-fill" + (s.status === "ERROR" ? " error" : "") });
    fill.style.left = Math.min(100, (100 * s.offset_ms) / total).toFixed(2) + "%";
    fill.style.width = Math.max(0.4, Math.min(100, (100 * s.duration_ms) / total)).toFixed(2) + "%";
    const attributes = Object.keys(s.attributes || {}).map((k) => k + " = " + JSON.stringify(s.attributes[k])).join("\n");
    const row = [
      h("span", { class: "trace-label" }, h("span", { class: "mono", "data-testid": "trace-span-name" }, s.name), " ",
        h("span", { class: "muted small" }, String(s.kind || "").toLowerCase() + " · " + (s.role || "?") + (s.orphan ? " · parent not in the files" : "") + (s.status === "ERROR" ? " · failed" + (s.status_description ? ": " + s.status_description : "") : ""))),
      h("span", { class: "num small", "data-testid": "trace-span-duration" }, dur(s.duration_ms / 1000)),
      h("span", { class: "trace-bar" }, fill),
    ];
    if (!s.children.length) return h("li", { "data-testid": "trace-span" }, h("div", { class: "trace-row leaf", title: attributes }, row));
    return h("li", { "data-testid": "trace-span" },
      h("details", { open: true }, h("summary", { class: "trace-summary", title: attributes }, h("span", { class: "trace-row" }, row)),
        h("ul", { class: "trace-tree" }, s.children.map((c) => traceSpan(c, total)))));
  }

  function renderSteps(root, detail) {
    clear(root);
    const rows = detail.steps.map((s) =>
      h("tr", { "data-testid": "step-row" },
        h("td", {}, s.name), h("td", {}, badge(s.state)), h("td", { class: "num" }, num(s.generation)), h("td", { class: "num" }, num(s.requests)),
        h("td", { class: "num" }, num(s.failures)), h("td", { class: "num" }, num(s.deferrals)), timeCell(s.started_at),
        h("td", { class: "num" }, s.duration_s === null || s.duration_s === undefined ? "—" : dur(s.duration_s)),
        h("td", {}, s.error_code ? s.error_code + ": " + (s.error_message || "") : "",
          (s.reasons || []).length ? h("ul", { class: "small" }, s.reasons.map((r) => h("li", {}, r))) : null)));
    append(root, h("h2", {}, "Steps"), h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Step", "State", "Gen.", "Requests", "Failures", "Deferrals", "Started", "Took", "Replies and reasons"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))));
  }

  function renderTimeline(root, timeline) {
    clear(root);
    const rows = timeline.map((e) =>
      h("tr", { "data-testid": "timeline-row", "data-event": e.event },
        h("td", { class: "num" }, e.seq), timeCell(e.at), h("td", { class: "mono small" }, e.actor), h("td", {}, e.event),
        h("td", {}, (e.from_state || "—") + " → " + e.to_state), h("td", {}, e.step || ""), h("td", { class: "num" }, e.attempt),
        h("td", {}, e.detail || "")));
    append(root, h("h2", {}, "Timeline entries"), h("div", { class: "table-wrap" }, h("table", { "data-testid": "timeline-table" },
      h("thead", {}, h("tr", {}, ["#", "At", "Actor", "Event", "State", "Step", "Req.", "Detail"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows))));
  }

  // ------------------------------------------------------------------------------- alerts

  function viewAlerts(root, params) {
    const openOnly = params.open !== "false";
    const toggle = h("input", { type: "checkbox", checked: openOnly, "data-testid": "alerts-open-only", onchange: () => (location.hash = "#/alerts" + query({ open: toggle.checked ? "" : "false" })) });
    const holder = h("div", { class: "table-wrap" });
    const pager = h("div", { class: "pager" });
    append(root, h("div", { class: "toolbar" }, h("h1", {}, "Alerts"), h("span", { class: "spacer" }), h("label", { class: "check" }, toggle, "Open and retrying only")), holder, pager);

    async function load() {
      const page = (await api("alerts" + query({ open: openOnly ? "true" : "false", limit: 50, continuation: params.c }))).data;
      clear(holder);
      if (!page.items.length) append(holder, h("div", { class: "empty", "data-testid": "no-alerts" }, openOnly ? "No open alert on this page." : "No alert on this page."));
      else {
        append(holder, h("table", { "data-testid": "alerts-table" },
          h("thead", {}, h("tr", {}, ["#", "Raised", "Severity", "Reason", "Order", "Resolution", "Detail", ""].map((t) => h("th", {}, t)))),
          h("tbody", {}, page.items.map((a) => alertRow(a, load)))));
      }
      clear(pager);
      if (params.c) append(pager, hashLink("#/alerts" + query({ open: openOnly ? "" : "false" }), "« First page"));
      if (page.continuation) append(pager, hashLink("#/alerts" + query({ open: openOnly ? "" : "false", c: page.continuation }), "Next page »"));
    }
    return every(15000, load);
  }

  function alertRow(a, reload) {
    const alert = a.alert || {};
    const orderCell = alert.order_id ? hashLink("#/order/" + encodeURIComponent(alert.order_id), alert.order_id) : "—";
    return h("tr", { "data-testid": "alert-row", "data-sequence": a.sequence_number, "data-order-id": alert.order_id || "" },
      h("td", { class: "num" }, a.sequence_number), timeCell(a.enqueued_at), h("td", {}, badge(alert.severity || "unreadable")),
      h("td", {}, alert.reason || a.problem || "—"), h("td", { class: "mono" }, orderCell),
      h("td", {}, badge(a.resolution), a.order_state ? h("div", { class: "muted small" }, "order " + a.order_state) : null),
      h("td", { class: "clip", title: alert.detail || a.raw || "" }, alert.detail || a.raw || ""),
      h("td", { class: "actions" },
        actionButton("Acknowledge…", () => acknowledge(a, reload), { "data-testid": "ack" }),
        alert.order_id && a.order_state === "Error"
          ? actionButton("Resubmit order…", () => orderAction(alert.order_id, "resubmit", reload), { "data-testid": "alert-resubmit" })
          : null));
  }

  async function acknowledge(a, reload) {
    const alert = a.alert || {};
    const answer = await ask({
      title: "Acknowledge alert " + a.sequence_number,
      body: [h("p", {}, "The alert leaves the alerts queue" + (alert.order_id ? " and the acknowledgement, with your reason, is recorded in order " + alert.order_id + "'s timeline." : "; the acknowledgement and your reason go to the audit log.")),
        h("p", { class: "muted small" }, (alert.reason || "") + ": " + (alert.detail || ""))],
      confirm: "Acknowledge",
    });
    if (!answer) return;
    try {
      const done = (await api("alerts/" + a.sequence_number + "/ack", { method: "POST", body: { reason: answer.reason } })).data;
      notify("ok", "alert " + done.sequence_number + " acknowledged by " + done.acknowledged_by + (done.recorded_in_timeline ? "; recorded in " + done.order_id + "'s timeline" : ""));
      await reload();
    } catch (error) {
      notify("bad", "alert " + a.sequence_number + ": " + describe(error));
    }
  }

  // ------------------------------------------------------------------------- dead letters

  function viewDeadLetters(root, params, queue) {
    if (!queue) {
      const holder = h("div", { class: "table-wrap" }, h("div", { class: "empty" }, "Counting the dead letters of every queue…"));
      const stamp = h("p", { class: "muted small" });
      const log = deadLetterLog();
      append(root, h("h1", {}, "Dead letters"), h("p", { class: "muted" }, QUEUE_ROLES_NOTE), holder, stamp, log.panel);
      const stopLog = every(LOG_REFRESH_MS, log.load);
      // The counts come from the overview's summary, which peeks every queue in the background
      // at most every 15 s however many pages ask (GET /api/dead-letters peeks them all now).
      const stopCounts = every(REFRESH_MS, async () => {
        const dead = (await api("dashboard/summary")).data.dead_letters || {};
        if (unknown(dead)) {
          stamp.textContent = failed(dead) || "";
          return;
        }
        stamp.textContent = "counted " + ago(dead.read_at) + "; counted again every 15 s";
        clear(holder);
        append(holder, h("table", { "data-testid": "dead-letter-queues" },
          h("thead", {}, h("tr", {}, h("th", {}, "Queue"), h("th", {}, "Service Bus queue"), h("th", { class: "num" }, "Dead letters"))),
          h("tbody", {}, dead.queues.map((q) => h("tr", { "data-testid": "dead-letter-queue", "data-queue": q.queue },
            h("td", {}, hashLink("#/dead-letters/" + encodeURIComponent(q.queue), q.queue)), h("td", { class: "mono" }, q.entity),
            h("td", { class: "num" }, q.count + (q.more ? "+" : "")))))));
      });
      return () => {
        stopCounts();
        stopLog();
      };
    }
    const holder = h("div", { class: "table-wrap" });
    const pager = h("div", { class: "pager" });
    const selected = new Set();
    const unselect = () => {
      selected.clear();
      for (const box of holder.querySelectorAll("input[type=checkbox]")) box.checked = false;
    };
    const act = (kind, all) => deadLetterAction(queue, kind, all ? null : Array.from(selected), unselect, load);
    const buttons = h("div", { class: "actions" },
      actionButton("Replay selected…", () => act("replay", false), { "data-testid": "replay-selected" }),
      actionButton("Purge selected…", () => act("purge", false), { class: "danger", "data-testid": "purge-selected" }),
      actionButton("Replay all…", () => act("replay", true), { "data-testid": "replay-all" }),
      actionButton("Purge all…", () => act("purge", true), { class: "danger", "data-testid": "purge-all" }));
    const log = deadLetterLog();
    append(root, h("div", { class: "toolbar" }, h("h1", {}, "Dead letters: ", h("span", { class: "mono" }, queue)), h("span", { class: "spacer" }), buttons),
      h("p", {}, hashLink("#/dead-letters", "« all queues")), holder, pager, log.panel);

    async function load() {
      const page = (await api("dead-letters/" + encodeURIComponent(queue) + query({ limit: 50, continuation: params.c }))).data;
      selected.clear();
      clear(holder);
      if (!page.items.length) {
        append(holder, h("div", { class: "empty", "data-testid": "no-dead-letters" }, "No dead letter in " + page.entity + "."));
      } else {
        append(holder, h("table", { "data-testid": "dead-letters-table" },
          h("thead", {}, h("tr", {}, ["", "#", "Dead-lettered", "Deliveries", "Reason", "Subject", "Body"].map((t) => h("th", {}, t)))),
          h("tbody", {}, page.items.map((m) => {
            const box = h("input", { type: "checkbox", "aria-label": "select " + m.sequence_number, "data-testid": "select-dead-letter" });
            box.addEventListener("change", () => (box.checked ? selected.add(m.sequence_number) : selected.delete(m.sequence_number)));
            const body = m.body !== null && m.body !== undefined ? JSON.stringify(m.body, null, 2) : m.raw || "";
            return h("tr", { "data-testid": "dead-letter-row", "data-sequence": m.sequence_number },
              h("td", {}, box), h("td", { class: "num" }, m.sequence_number), timeCell(m.enqueued_at), h("td", { class: "num" }, num(m.delivery_count)),
              h("td", {}, m.reason || "—", h("div", { class: "muted small" }, m.description || "")), h("td", {}, m.subject || ""),
              h("td", {}, h("pre", { class: "small" }, body.length > 2000 ? body.slice(0, 2000) + "…" : body)));
          }))));
      }
      clear(pager);
      if (params.c) append(pager, hashLink("#/dead-letters/" + encodeURIComponent(queue), "« First page"));
      if (page.continuation) append(pager, hashLink("#/dead-letters/" + encodeURIComponent(queue) + query({ c: page.continuation }), "Next page »"));
      await log.load();
    }
    return every(15000, load);
  }

  /**
   * The latest replays and purges of every queue (GET /api/dead-letter-log: one read of one
   * table partition): when, who, what, why, and what became of the messages. Stored text
   * (the reason, the operator's name) is set as text. A failure to read it is said in the
   * panel: the dead letters above are still usable.
   */
  function deadLetterLog() {
    const holder = h("div", { class: "table-wrap" }, h("div", { class: "empty" }, "Reading the dead-letter log…"));
    const panel = h("section", { "data-testid": "dead-letter-log" },
      h("h2", {}, "Latest replays and purges"),
      h("p", { class: "muted small" }, "From the dead-letter log: every replay and purge that was not a dry run, newest first (the latest " + LOG_LIMIT + ")."),
      holder);
    async function load() {
      let log;
      try {
        log = (await api("dead-letter-log" + query({ limit: LOG_LIMIT }))).data;
      } catch (error) {
        clear(holder);
        append(holder, h("div", { class: "empty error-text" }, "dead-letter log unavailable: " + describe(error)));
        return;
      }
      clear(holder);
      if (!log.actions.length) {
        append(holder, h("div", { class: "empty", "data-testid": "no-dead-letter-actions" }, "No dead letter has been replayed or purged."));
        return;
      }
      append(holder, h("table", {},
        h("thead", {}, h("tr", {}, ["When", "By", "Action", "Queue", "Reason", "Messages", "Outcomes"].map((t) => h("th", { class: t === "Messages" ? "num" : null }, t)))),
        h("tbody", {}, log.actions.map((a) => h("tr", { "data-testid": "dead-letter-action" },
          timeCell(a.at), h("td", { class: "mono small" }, a.actor), h("td", {}, a.action),
          h("td", {}, hashLink("#/dead-letters/" + encodeURIComponent(a.queue), a.queue)),
          h("td", { class: "reason" }, a.reason),
          h("td", { class: "num", title: a.truncated ? "more messages than the log could store" : null }, a.messages + (a.truncated ? "+" : "")),
          h("td", {}, Object.keys(a.counts).sort().map((k) => h("span", { class: "outcome" }, a.counts[k] + " ", badge(k)))))))));
    }
    return { panel: panel, load: load };
  }

  async function deadLetterAction(queue, kind, sequences, unselect, reload) {
    if (sequences !== null && !sequences.length) {
      notify("bad", "select dead letters first (or use " + kind + " all)");
      return;
    }
    const which = sequences === null ? { all: true } : { sequence_numbers: sequences };
    let preview;
    try {
      preview = (await api("dead-letters/" + encodeURIComponent(queue) + "/" + kind, { method: "POST", body: Object.assign({ dry_run: true }, which) })).data;
    } catch (error) {
      notify("bad", kind + ": " + describe(error));
      return;
    }
    const list = h("div", { class: "preview" }, h("table", { "data-testid": "dead-letter-preview" }, h("tbody", {}, preview.items.map((o) =>
      h("tr", {}, h("td", { class: "num" }, o.sequence_number), h("td", {}, badge(o.outcome)), h("td", { class: "mono small" }, o.order_id || ""), h("td", {}, o.detail || ""))))));
    const answer = await ask({
      title: (kind === "replay" ? "Replay " : "Purge ") + preview.items.length + " dead letter(s) of " + queue,
      body: [h("p", {}, kind === "replay"
        ? "Each is sent back to its queue as first sent (same body, MessageId and properties), then removed from the dead letters. Refused ones stay."
        : "Each is removed for good."), list,
        h("p", { class: "muted small" }, "Who acted and why is recorded in the timeline of each order a message names, and in the dead-letter log.")],
      confirm: kind === "replay" ? "Replay" : "Purge",
      danger: kind === "purge",
    });
    if (!answer) return;
    try {
      const body = Object.assign({}, which, { reason: answer.reason });
      const done = (await api("dead-letters/" + encodeURIComponent(queue) + "/" + kind, { method: "POST", body: body })).data;
      unselect();
      const counts = {};
      for (const item of done.items) counts[item.outcome] = (counts[item.outcome] || 0) + 1;
      const refused = done.items.filter((i) => i.outcome === "refused" || i.outcome === "failed").map((i) => i.sequence_number + ": " + i.detail);
      const summary = Object.keys(counts).map((k) => counts[k] + " " + k).join(", ") || "nothing done";
      notify(refused.length ? "bad" : "ok", kind + " " + queue + ": " + summary + (refused.length ? " — " + refused.join("; ") : ""));
      await reload();
    } catch (error) {
      notify("bad", kind + ": " + describe(error));
    }
  }

  // --------------------------------------------------------------------------- supervisor

  function viewSupervisor(root) {
    const facts = h("div", { class: "panel" });
    const health = h("div", { class: "panel" });
    const buckets = h("div", { class: "table-wrap" });
    append(root, h("h1", {}, "Supervisor and health"), h("div", { class: "row" }, h("div", { class: "grow" }, facts), h("div", { class: "grow" }, health)), h("h2", {}, "Index buckets"), buckets);
    return every(REFRESH_MS, async () => {
      const view = (await api("supervisor")).data;
      const bound = view.bound || {};
      clear(facts);
      append(facts, h("h2", {}, "Recovery"), h("dl", { class: "facts", "data-testid": "supervisor-facts" }, [
        ["Lag", dur(view.lag_s)], ["Oldest sweep", view.oldest_sweep_s === null ? "never" : dur(view.oldest_sweep_s) + " ago"],
        ["Buckets not swept in time", view.unswept_buckets.length ? view.unswept_buckets.join(", ") : "none"],
        ["Holders", Object.keys(view.holders).map((k) => k + " (" + view.holders[k] + ")").join(", ") || "none"],
        ["Period / budget / lease", dur(bound.period) + " / " + dur(bound.budget) + " / " + dur(bound.lease)],
        ["Recovery bound (deadline to action)", dur(bound.detection_s)], ["Longest stall", dur(bound.stall_s)],
        ["Backlog (rows due, left for later)", view.backlog + " (" + view.left + ")"],
        ["Drain rate / time to drain", view.drain_rate.toFixed(1) + " rows/s / " + (view.time_to_drain_s === null ? "unknown" : dur(view.time_to_drain_s)) + (view.drains_within_period ? "" : " — not within a period")],
      ].map((f) => [h("dt", {}, f[0]), h("dd", {}, f[1])])));
      clear(buckets);
      append(buckets, h("table", {}, h("thead", {}, h("tr", {}, ["Bucket", "Holder", "Leased until", "Swept", "By", "Lag", "Due found"].map((t) => h("th", {}, t)))),
        h("tbody", {}, view.buckets.map((b) => h("tr", {}, h("td", { class: "num" }, b.bucket), h("td", { class: "mono small" }, b.holder || "—"), timeCell(b.leased_until),
          timeCell(b.swept_at), h("td", { class: "mono small" }, b.swept_by || "—"), h("td", { class: "num" }, dur(b.lag_s)), h("td", { class: "num" }, b.due_found))))));
      let checks;
      try {
        checks = (await api("health")).data;
      } catch (error) {
        checks = { status: "failing", checks: [{ name: "health", ok: false, detail: describe(error), duration_ms: 0 }] };
      }
      clear(health);
      append(health, h("h2", {}, "Health ", badge(checks.status === "ok" ? "resolved" : "error")),
        h("table", { "data-testid": "health" }, h("tbody", {}, (checks.checks || []).map((c) =>
          h("tr", {}, h("td", {}, c.name), h("td", {}, c.ok ? "ok" : "failing"), h("td", {}, c.detail), h("td", { class: "num" }, c.duration_ms + " ms"))))));
    });
  }

  // ------------------------------------------------------------------------------- router

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, search] = raw.split("?");
    const parts = path.split("/").filter(Boolean).map((p) => decodeURIComponent(p));
    const params = Object.fromEntries(new URLSearchParams(search || ""));
    return { name: parts[0] || "overview", arg: parts[1] || null, params: params };
  }

  function render() {
    if (app.dispose) {
      try {
        app.dispose();
      } catch {
        /* a view that failed to stop must not keep the next from rendering */
      }
      app.dispose = null;
    }
    const route = parseHash();
    const root = clear(document.getElementById("view"));
    root.setAttribute("data-view", route.name);
    for (const link of document.querySelectorAll("nav a[data-view]")) {
      link.classList.toggle("active", link.getAttribute("data-view") === (route.name === "order" ? "orders" : route.name));
    }
    const views = {
      overview: () => viewOverview(root, route.params),
      orders: () => viewOrders(root, route.params),
      order: () => viewOrder(root, route.params, route.arg || ""),
      alerts: () => viewAlerts(root, route.params),
      "dead-letters": () => viewDeadLetters(root, route.params, route.arg),
      supervisor: () => viewSupervisor(root, route.params),
    };
    const view = views[route.name];
    if (!view) {
      append(root, h("p", { class: "error-text" }, "No such view: " + route.name));
      return;
    }
    app.dispose = view();
  }

  document.getElementById("api-docs-link").setAttribute("href", pageUrl("/api/dashboard/api-docs"));
  window.addEventListener("hashchange", render);
  loadMe().finally(render);
})();
