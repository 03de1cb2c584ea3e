// kbroker's live dashboard: follows /dashboard/stream (one snapshot a second, server-sent events)
// and charts each queue with uPlot. Plain JavaScript, no build step.
//
// For tests and the curious, window.kbrokerDashboard exposes what the page shows:
//   .connected, .snapshots (how many arrived), .latest (the last snapshot),
//   .history[queue] = {t: [...], backlog: [...], arrivals_per_s: [...], ...} (what the charts plot),
//   .queues() (the queues shown, from the DOM), .last(queue) (its newest point),
//   .plotted(queue, chart) (the newest values in that chart's data: [t, series...]).
(function () {
  "use strict";

  const MAX_POINTS = 600; // ten minutes at one snapshot a second
  const FIELDS = ["backlog", "arrivals_per_s", "receives_per_s", "stale_10s", "stale_60s", "stale_queue",
                  "oldest_age_s", "readers"];
  const CHARTS = [
    {key: "backlog", title: "Backlog (messages)", series: [["backlog", "backlog", "#3f6fd8"]]},
    {key: "throughput", title: "Throughput (messages/s)",
     series: [["arrivals_per_s", "arrivals/s", "#2e9d4f"], ["receives_per_s", "receives/s", "#d2701c"]]},
    {key: "stale", title: "Stale messages (unreceived, older than)",
     series: [["stale_10s", "10 s", "#d99a1e"], ["stale_60s", "60 s", "#9b4fc4"],
              ["stale_queue", "stale_after", "#d23c3c"]]},
    {key: "age", title: "Oldest unreceived message (s)", series: [["oldest_age_s", "age", "#4b5563"]]},
  ];

  const D = window.kbrokerDashboard = {
    connected: false, snapshots: 0, latest: null, history: {}, charts: {}, errors: 0,
    queues() {
      return Array.from(document.querySelectorAll(".queue-card[data-queue]"), (e) => e.dataset.queue);
    },
    last(queue) {
      const q = D.latest && D.latest.queues[queue];
      return q ? Object.assign({at: D.latest.at}, q) : null;
    },
    plotted(queue, chart) {
      const u = D.charts[queue] && D.charts[queue][chart];
      if (!u || !u.data[0].length) return null;
      const n = u.data[0].length;
      return u.data.map((a) => a[n - 1]);
    },
  };

  const $ = (sel, root) => (root || document).querySelector(sel);
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  const show = (v, digits) => (v === null || v === undefined ? "\u2014" :
    (typeof v === "number" && digits !== undefined ? v.toFixed(digits) : String(v)));

  function status(id, state, text) {
    const s = document.getElementById(id);
    s.dataset.state = state;
    s.textContent = text;
  }

  // --- one card per queue: a header and four charts ---------------------------------------

  function chartWidth(plot) {
    return Math.max(260, Math.floor(plot.getBoundingClientRect().width || 320));
  }

  const pad = (n) => String(n).padStart(2, "0");
  function clock(t) {
    const d = new Date(t * 1000);
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function makeChart(plot, spec, data) {
    const opts = {
      width: chartWidth(plot), height: 150,
      scales: {x: {time: true}, y: {range: (u, min, max) => [0, Math.max(1, max === null ? 1 : max * 1.1)]}},
      series: [{}].concat(spec.series.map(([, label, color]) => ({
        label, stroke: color, width: 1.5, fill: spec.series.length === 1 ? color + "22" : undefined,
        spanGaps: false, // uPlot draws the points themselves while they are few (a lone value shows)
        value: (u, v) => (v === null || v === undefined ? "\u2014" : +v.toFixed(2)),
      }))),
      axes: [{space: 70, values: (u, splits) => splits.map(clock)}, {size: 48}],
      legend: {live: false},
      cursor: {drag: {x: false, y: false}},
    };
    return new uPlot(opts, data, plot);
  }

  function chartData(h, spec) {
    return [h.t].concat(spec.series.map(([field]) => h[field]));
  }

  function addCard(queue) {
    const card = el("section", {"class": "queue-card", "data-queue": queue});
    const head = el("header");
    head.append(el("h3", {}, queue));
    const badge = el("span", {"class": "badge", "data-role": "state"}, "\u2014");
    head.append(badge);
    for (const [role, label] of [["backlog", "backlog"], ["readers", "readers"], ["rates", "in/out per s"],
                                 ["stale", "stale"]]) {
      const kv = el("span", {"class": "kv"}, label + " ");
      kv.append(el("b", {"data-role": role}, "\u2014"));
      head.append(kv);
    }
    card.append(head);
    const charts = el("div", {"class": "charts"});
    card.append(charts);
    const container = $("#queues");
    const empty = $(".empty", container);
    if (empty) empty.remove();
    // Cards in name order, as the tables are.
    const after = Array.from(container.children).find((c) => c.dataset.queue > queue);
    container.insertBefore(card, after || null);
    const h = D.history[queue];
    D.charts[queue] = {};
    for (const spec of CHARTS) {
      const box = el("div", {"class": "chart", "data-queue": queue, "data-chart": spec.key});
      box.append(el("h4", {}, spec.title));
      const plot = el("div", {"class": "plot"});
      box.append(plot);
      charts.append(box);
      D.charts[queue][spec.key] = makeChart(plot, spec, chartData(h, spec));
    }
  }

  function removeCard(queue) {
    const card = document.querySelector(`.queue-card[data-queue="${CSS.escape(queue)}"]`);
    for (const u of Object.values(D.charts[queue] || {})) u.destroy();
    if (card) card.remove();
    delete D.charts[queue];
    delete D.history[queue];
  }

  function updateCard(queue, q) {
    const card = document.querySelector(`.queue-card[data-queue="${CSS.escape(queue)}"]`);
    const badge = $('[data-role="state"]', card);
    badge.textContent = q.monitor_state || (q.activation === "OFF" ? "no activation" : "no monitor");
    badge.dataset.state = q.monitor_state || "";
    $('[data-role="backlog"]', card).textContent = show(q.backlog) +
      (q.backlog_source ? ` (${q.backlog_source})` : "");
    $('[data-role="readers"]', card).textContent = show(q.readers) +
      (q.max_readers !== null && q.max_readers !== undefined ? " / " + q.max_readers : "");
    $('[data-role="rates"]', card).textContent = show(q.arrivals_per_s, 1) + " / " + show(q.receives_per_s, 1);
    $('[data-role="stale"]', card).textContent = show(q.stale_queue) +
      (q.stale_after_s ? ` (> ${q.stale_after_s} s)` : "");
    const h = D.history[queue];
    for (const spec of CHARTS) D.charts[queue][spec.key].setData(chartData(h, spec));
  }

  // --- tables ---------------------------------------------------------------------------

  function row(cells, attrs) {
    const tr = el("tr", attrs);
    for (const [v, num] of cells) tr.append(el("td", num ? {"class": "num"} : {}, show(v)));
    return tr;
  }

  function renderTables(snap) {
    const mon = $("#monitors tbody");
    mon.replaceChildren(...Object.entries(snap.queues).map(([queue, q]) => row([
      [queue], [q.activation], [q.monitor_state], [q.readers, true], [q.max_readers, true], [q.backlog, true],
      [q.ready_groups, true], [q.stale_queue, true], [q.oldest_age_s, true],
      [q.degraded === null || q.degraded === undefined ? null : (q.degraded ? "yes" : "no")],
    ], {"data-queue": queue})));
    const tasks = $("#tasks tbody");
    if (!snap.tasks.length) {
      const tr = el("tr");
      tr.append(el("td", {"colspan": "6", "class": "empty"}, "no activated readers running"));
      tasks.replaceChildren(tr);
    } else {
      tasks.replaceChildren(...snap.tasks.map((t) => row([
        [t.queue], [t.task_id], [t.procedure], [t.generation, true], [t.handler],
        [t.started_at ? (snap.at - t.started_at).toFixed(1) + " s" : null, true],
      ], {"data-queue": t.queue})));
    }
  }

  // --- snapshots --------------------------------------------------------------------------

  function take(snap) {
    D.latest = snap;
    D.snapshots += 1;
    $("#namespace").textContent = snap.namespace;
    $("#worker").textContent = snap.worker;
    const a = snap.analytics || {};
    if (a.error) status("analytics", "error", "analytics: " + a.error);
    else if (a.as_of === null || a.as_of === undefined) status("analytics", "none", "analytics: no data yet (kbroker analytics run)");
    else status("analytics", a.age_s > 30 ? "stale" : "ok", `analytics: as of ${show(a.age_s, 0)} s ago`);
    const m = snap.monitors || {};
    if (m.error) status("monitors-status", "error", "monitors: " + m.error);
    else if (!m.as_of) status("monitors-status", "none", "monitors: no data yet");
    else status("monitors-status", "ok", `monitors: read ${Math.max(0, snap.at - m.as_of).toFixed(0)} s ago`);

    for (const queue of Object.keys(D.history)) if (!(queue in snap.queues)) removeCard(queue);
    for (const [queue, q] of Object.entries(snap.queues)) {
      let h = D.history[queue];
      if (!h) {
        h = D.history[queue] = {t: []};
        for (const f of FIELDS) h[f] = [];
      }
      h.t.push(snap.at);
      for (const f of FIELDS) h[f].push(q[f] === undefined ? null : q[f]);
      if (h.t.length > MAX_POINTS) for (const k of Object.keys(h)) h[k].shift();
      if (!D.charts[queue]) addCard(queue);
      updateCard(queue, q);
    }
    renderTables(snap);
  }

  function connect() {
    const source = new EventSource("/dashboard/stream");
    source.onopen = () => { D.connected = true; status("connection", "ok", "live"); };
    source.onerror = () => {
      D.connected = false;
      D.errors += 1;
      status("connection", "error", "disconnected, retrying");
    };
    source.onmessage = (ev) => {
      try {
        take(JSON.parse(ev.data));
      } catch (err) {
        console.error("kbroker dashboard: a snapshot could not be shown", err);
      }
    };
    D.source = source;
  }

  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      for (const charts of Object.values(D.charts)) {
        for (const u of Object.values(charts)) u.setSize({width: chartWidth(u.root.parentElement), height: 150});
      }
    }, 150);
  });

  connect();
})();
