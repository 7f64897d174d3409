/* One order's steps as a Gantt-like timeline, read from its timeline entries.
 *
 * How the timeline says it (core/lifecycle.py): every entry records the order's request
 * counter (`attempt`) after its write, so an entry whose counter went up sent one request, and
 * an order has at most one request outstanding. The request is for the entry's step, except
 * after `step_succeeded` and `step_compensated`, whose entry names the step that finished
 * ("... succeeded; next X", "...: undone; next undo X"). A request sent while the order is
 * Compensating is an undo. It ends at the next entry that sends another request or leaves the
 * state it was sent in (Pending: released or deferred for a retry; Error; Processed;
 * Compensating: a cancel or a decline). Between a released or deferred attempt and the next
 * request of the same step, the step waits (a retry's delay, or the Supervisor noticing).
 *
 * Entries that send nothing and change no state (a late answer, an operator's note) are
 * markers, as are operator and Supervisor actions.
 *
 * Everything shown is set as text (SVG <title>, textContent): stored text is never markup.
 */
(function () {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";
  const NEXT = /next (?:undo )?([A-Za-z0-9_.-]+)\s*$/;

  function when(iso) {
    return Date.parse(iso);
  }

  function outcomeOf(bar, entry) {
    const operator = String(entry.actor || "").startsWith("operator:");
    const event = entry.event;
    if (event === "released") return "retry";
    if (event === "deferred") return "deferred";
    if (bar.kind === "undo") {
      return ["step_compensated", "compensated", "error"].includes(event) ? "undone" : "ended";
    }
    if (event === "step_succeeded" || event === "processed") return "succeeded";
    if (event === "compensation_started" || event === "error") {
      return operator ? "cancelled" : "declined";
    }
    return "ended";
  }

  function build(detail, nowMs) {
    const steps = (detail.steps || []).slice().sort((a, b) => a.index - b.index);
    const stepNames = steps.map((s) => s.name);
    const timeline = (detail.timeline || []).slice().sort((a, b) => a.seq - b.seq);
    const bars = [];
    const waits = [];
    const markers = [];
    let open = null;
    let sent = 0;
    let lastRelease = {};
    const terminal = ["Processed", "Error"].includes(detail.order && detail.order.state);

    for (const entry of timeline) {
      const at = when(entry.at);
      const requested = entry.attempt > sent;
      sent = Math.max(sent, entry.attempt);
      const leaves =
        open !== null &&
        (requested ||
          entry.event === "released" ||
          entry.event === "deferred" ||
          entry.to_state !== open.state ||
          ["Pending", "Error", "Processed"].includes(entry.to_state));
      if (leaves) {
        open.end = at;
        open.outcome = outcomeOf(open, entry);
        open.closedBy = entry;
        if (open.outcome === "retry" || open.outcome === "deferred") {
          lastRelease[open.step + ":" + open.kind] = { at: at, entry: entry };
        }
        open = null;
      }
      if (requested && (entry.to_state === "Processing" || entry.to_state === "Compensating")) {
        let step = entry.step;
        if (entry.event === "step_succeeded" || entry.event === "step_compensated") {
          const match = NEXT.exec(entry.detail || "");
          if (match && stepNames.includes(match[1])) step = match[1];
          else if (entry.event === "step_succeeded") {
            const i = stepNames.indexOf(entry.step);
            step = i >= 0 && i + 1 < stepNames.length ? stepNames[i + 1] : entry.step;
          }
        }
        const kind = entry.to_state === "Compensating" ? "undo" : "do";
        const waited = lastRelease[step + ":" + kind];
        if (waited && waited.at <= at) {
          waits.push({ step: step, start: waited.at, end: at, why: waited.entry.detail || waited.entry.event });
          delete lastRelease[step + ":" + kind];
        }
        open = {
          step: step,
          kind: kind,
          state: entry.to_state,
          attempt: entry.attempt,
          start: at,
          end: null,
          outcome: "running",
          openedBy: entry,
          closedBy: null,
        };
        bars.push(open);
      } else if (!requested && !leaves && entry.seq > 0) {
        markers.push({ step: entry.step, at: at, entry: entry });
      }
      const actor = String(entry.actor || "");
      if ((requested || leaves) && (actor.startsWith("operator:") || actor.startsWith("supervisor:"))) {
        markers.push({ step: entry.step, at: at, entry: entry });
      }
    }
    const times = timeline.map((e) => when(e.at));
    let end = times.length ? Math.max.apply(null, times) : nowMs;
    if (open !== null && !terminal) {
      open.end = null;
      end = Math.max(end, nowMs);
    }
    for (const release of Object.keys(lastRelease)) {
      // Released or deferred with nothing sent since: still waiting (or it ended there).
      const waited = lastRelease[release];
      const step = release.slice(0, release.lastIndexOf(":"));
      if (!terminal) {
        waits.push({ step: step, start: waited.at, end: null, why: waited.entry.detail || waited.entry.event });
        end = Math.max(end, nowMs);
      }
    }
    const start = times.length ? Math.min.apply(null, times) : nowMs;
    return { steps: stepNames, bars: bars, waits: waits, markers: markers, start: start, end: Math.max(end, start + 1) };
  }

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const key of Object.keys(attrs || {})) node.setAttribute(key, String(attrs[key]));
    if (parent) parent.appendChild(node);
    return node;
  }

  function title(node, text) {
    const t = el("title", {}, node);
    t.textContent = text;
  }

  function seconds(ms) {
    const s = ms / 1000;
    if (s < 1) return Math.round(ms) + " ms";
    if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + " s";
    return (s / 60).toFixed(1) + " min";
  }

  function ticks(span) {
    const steps = [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600];
    for (const step of steps) if (span / 1000 / step <= 8) return step * 1000;
    return 7200 * 1000;
  }

  function render(model, options) {
    const width = Math.max(480, options.width || 900);
    const label = 170;
    const lane = 30;
    const lanes = model.steps.length ? model.steps : ["(no steps)"];
    const top = 24;
    const height = top + lanes.length * lane + 8;
    const span = model.end - model.start;
    const plot = width - label - 12;
    const x = (t) => label + ((t - model.start) / span) * plot;
    const y = (step) => {
      const i = lanes.indexOf(step);
      return top + (i < 0 ? lanes.length - 1 : i) * lane;
    };
    const svg = el("svg", {
      class: "gantt",
      width: width,
      height: height,
      viewBox: "0 0 " + width + " " + height,
      role: "img",
      "data-testid": "gantt",
    });
    title(svg, "Steps of the order over time: one bar per request, waits hatched, markers for operator, Supervisor and late entries");
    const defs = el("defs", {}, svg);
    const pattern = el("pattern", { id: "wait-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, defs);
    el("rect", { width: 6, height: 6, class: "hatch-bg" }, pattern);
    el("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }, pattern);

    const tick = ticks(span);
    for (let t = 0; t <= span; t += tick) {
      const px = x(model.start + t);
      el("line", { x1: px, y1: top - 4, x2: px, y2: height - 8, class: "grid" }, svg);
      const text = el("text", { x: px + 2, y: 14, class: "tick" }, svg);
      text.textContent = "+" + seconds(t);
    }
    lanes.forEach((step, i) => {
      const row = el("rect", { x: 0, y: top + i * lane, width: width, height: lane, class: i % 2 ? "lane odd" : "lane" }, svg);
      row.setAttribute("data-step", step);
      const text = el("text", { x: 6, y: top + i * lane + lane / 2 + 4, class: "lane-label" }, svg);
      text.textContent = step;
    });
    const now = options.now || Date.now();
    for (const wait of model.waits) {
      const x1 = x(wait.start);
      const x2 = x(wait.end === null ? Math.min(now, model.end) : wait.end);
      const rect = el("rect", { x: x1, y: y(wait.step) + 11, width: Math.max(2, x2 - x1), height: 8, class: "wait", fill: "url(#wait-hatch)", "data-testid": "gantt-wait" }, svg);
      title(rect, wait.step + ": waiting " + seconds((wait.end || now) - wait.start) + " — " + wait.why);
    }
    for (const bar of model.bars) {
      const x1 = x(bar.start);
      const x2 = x(bar.end === null ? model.end : bar.end);
      const rect = el("rect", {
        x: x1,
        y: y(bar.step) + 6,
        width: Math.max(3, x2 - x1),
        height: lane - 12,
        rx: 2,
        class: "bar " + bar.kind + " " + bar.outcome,
        "data-testid": "gantt-bar",
        "data-step": bar.step,
        "data-kind": bar.kind,
        "data-outcome": bar.outcome,
      }, svg);
      const lasted = bar.end === null ? "running for " + seconds(now - bar.start) : seconds(bar.end - bar.start);
      const closed = bar.closedBy ? "\n" + bar.closedBy.event + ": " + (bar.closedBy.detail || "") : "";
      title(rect, bar.kind + " " + bar.step + " (request " + bar.attempt + ") — " + bar.outcome + ", " + lasted + closed);
    }
    for (const marker of model.markers) {
      const px = x(marker.at);
      const py = y(marker.step) + lane / 2;
      const actor = String(marker.entry.actor || "");
      const kind = actor.startsWith("operator:") ? "operator" : actor.startsWith("supervisor:") ? "supervisor" : "note";
      const shape =
        kind === "operator"
          ? el("polygon", { points: [px, py - 7, px + 7, py, px, py + 7, px - 7, py].join(" ") }, svg)
          : kind === "supervisor"
            ? el("polygon", { points: [px, py - 7, px + 7, py + 6, px - 7, py + 6].join(" ") }, svg)
            : el("circle", { cx: px, cy: py, r: 5 }, svg);
      shape.setAttribute("class", "marker " + kind);
      shape.setAttribute("data-testid", "gantt-marker");
      shape.setAttribute("data-kind", kind);
      title(shape, marker.entry.event + " by " + actor + "\n" + (marker.entry.detail || ""));
    }
    return svg;
  }

  window.Gantt = { build: build, render: render, seconds: seconds };
})();
