/* The console's overview (templates/consoles/overview.html): drawn from the figures embedded in
   the page, then from the overview's JSON, polled; no page reload, nothing from another origin.
   Each queue's trend is its rate history of the last hour (a point a step, kept by the nodes'
   housekeeping), the page's polls asking only for the points after the last it has, then the
   rates of each poll since that point. */
(function () {
  "use strict";
  const HOUR = 3600;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v; else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "-";
    if (seconds < 120) return Math.round(seconds) + " s";
    if (seconds < 7200) return Math.round(seconds / 60) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  /* trend[id] = {history: [[t, enq, ack], ...] (the nodes' points), live: [...] (this page's polls since)} */
  function merge(trend, data) {
    for (const q of data.queues) {
      const kept = trend[q.id] || (trend[q.id] = {history: [], live: []});
      const got = q.history || [];
      if (got.length) kept.history = kept.history.filter(p => p[0] < got[0][0]).concat(got);
      kept.history = kept.history.filter(p => p[0] > data.at - HOUR);
      const last = kept.history.length ? kept.history[kept.history.length - 1][0] : -Infinity;
      kept.live = kept.live.filter(p => p[0] > last && p[0] > data.at - HOUR);
      kept.live.push([data.at, q.enqueue_rate, q.ack_rate]);
    }
    for (const id of Object.keys(trend)) if (!data.queues.some(q => String(q.id) === id)) delete trend[id];
  }

  /* The history the page has up to (epoch seconds, less half a step: the last step is asked
     for again, another node may have added its partitions' points to it since), or null. */
  function historyAfter(trend, step) {
    let last = null;
    for (const kept of Object.values(trend)) {
      const h = kept.history;
      if (h.length && (last === null || h[h.length - 1][0] > last)) last = h[h.length - 1][0];
    }
    return last === null ? null : last - step / 2;
  }

  const SVG = "http://www.w3.org/2000/svg";

  function sparkline(points) {
    const w = 90, h = 18;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "sparkline");
    if (points.length < 2) return svg;
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    const top = Math.max(1e-9, ...points.map(p => Math.max(p[1], p[2])));
    for (const [i, cls] of [[1, "enq"], [2, "ack"]]) {
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", cls);
      line.setAttribute("points", points.map(p =>
        ((p[0] - t0) / Math.max(1, t1 - t0) * (w - 2) + 1).toFixed(1) + "," + (h - 1 - p[i] / top * (h - 2)).toFixed(1)
      ).join(" "));
      svg.append(line);
    }
    const title = document.createElementNS(SVG, "title");
    title.textContent = "peak " + top.toFixed(1) + "/s over " + age(t1 - t0);
    svg.append(title);
    return svg;
  }

  function mark(text, cls, title) { return el("span", {class: cls || "mark-warn", title: title}, text); }

  function draw(root, data, trend) {
    merge(trend, data);
    const queueUrl = root.dataset.queueUrl, topicUrl = root.dataset.topicUrl;
    const alerts = document.getElementById("overview-alerts");
    alerts.replaceChildren(...(data.alerts.length ? data.alerts.map(a => el("li", {class: "alert"}, a))
                                                  : [el("li", {class: "mark-quiet"}, "none")]));
    const body = document.querySelector("#overview-queues tbody");
    const rows = [];
    for (const q of data.queues) {
      const series = trend[q.id].history.concat(trend[q.id].live);
      const href = q.kind === "topic" ? topicUrl.replace("NAME", encodeURIComponent(q.name))
                                      : queueUrl.replace("/0/", "/" + q.id + "/");
      const marks = [];
      if (q.kind === "topic") marks.push(mark(q.subscriptions + " subscription" + (q.subscriptions === 1 ? "" : "s"), "mark-kind"));
      if (q.unowned) marks.push(mark("unowned " + q.unowned + "/" + q.partitions, "mark-warn", "partitions with no live owner"));
      if (q.cooling) marks.push(mark("cooling " + q.cooling, "mark-warn", "partitions on a node sending enqueues elsewhere"));
      if (q.behind) marks.push(mark("behind", "mark-warn", "takes in more than it acks, or its oldest message waits long"));
      const dead = q.dead_letters === null ? (q.dead_lettered_total ? "- / " + q.dead_lettered_total : "-")
                                           : q.dead_letters + " / " + q.dead_lettered_total;
      rows.push(el("tr", {"data-queue": q.name, "data-kind": q.kind},
        el("th", {scope: "row"}, el("a", {href: href}, q.name), q.kind === "topic" ? " " : null,
           q.kind === "topic" ? el("span", {class: "mark-kind"}, "topic") : null),
        el("td", {class: "num depth"}, q.depth), el("td", {class: "num"}, q.in_flight),
        el("td", {class: "num"}, q.delayed), el("td", {class: "num"}, dead),
        el("td", {class: "num"}, age(q.oldest_age)),
        el("td", {class: "num"}, q.enqueue_rate.toFixed(1) + " / " + q.ack_rate.toFixed(1)),
        el("td", null, sparkline(series)),
        el("td", {class: "marks"}, ...marks)));
    }
    body.replaceChildren(...rows);
    document.getElementById("overview-no-queues").hidden = data.queues.length > 0;

    const nodes = document.querySelector("#overview-nodes tbody");
    if (nodes) {
      const label = {};
      data.nodes.forEach((n, i) => { label[n.id] = "n" + (i + 1); });
      nodes.replaceChildren(...data.nodes.map((n, i) => el("tr", {"data-node": n.id},
        el("th", {scope: "row"}, el("span", {class: "swatch owner-" + (i % 8)}, label[n.id])),
        el("td", null, n.address), el("td", null, (n.hostname || "-") + ", " + (n.pid === null ? "-" : n.pid)),
        el("td", null, n.alive ? (n.cooling ? mark("cooling") : el("span", {class: "mark-quiet"}, "alive"))
                               : mark("not alive")),
        el("td", {class: "num"}, age(n.heartbeat_age)), el("td", {class: "num"}, n.up === null ? "stopped" : age(n.up)),
        el("td", {class: "num"}, n.held + " / " + Object.values(n.owns).reduce((s, v) => s + v.length, 0)),
        el("td", {class: "num"}, n.depth + " / " + n.in_flight))));
      const owner = {};
      data.nodes.forEach((n, i) => {
        for (const [name, indexes] of Object.entries(n.owns)) for (const x of indexes) owner[name + "/" + x] = [i, n];
      });
      const map = document.getElementById("overview-map");
      map.replaceChildren(...data.queues.map(q => {
        const cells = [];
        for (let x = 0; x < q.partitions; x++) {
          const o = owner[q.name + "/" + x];
          cells.push(el("span", {
            class: "cell " + (o ? "owner-" + (o[0] % 8) + (o[1].alive ? "" : " dead") : "unowned"),
            title: q.name + "/" + x + ": " + (o ? o[1].address + (o[1].alive ? "" : " (not alive)") : "no owner"),
          }, o ? label[o[1].id] : "-"));
        }
        return el("div", {class: "map-row", "data-queue": q.name}, el("span", {class: "map-name"}, q.name), el("span", {class: "map-cells"}, ...cells));
      }));
    }
    document.getElementById("overview-updated").textContent =
      "updated " + new Date(data.at * 1000).toLocaleTimeString() + ", every " + (Number(root.dataset.pollMs) / 1000) + " s";
  }

  function start() {
    const root = document.querySelector(".overview[data-source]");
    if (!root) return;
    const trend = {};
    const first = JSON.parse(document.getElementById("overview-figures").textContent);
    let step = first.history_step;
    draw(root, first, trend);
    const error = document.getElementById("overview-error");
    async function poll() {
      try {
        const after = historyAfter(trend, step);
        const url = root.dataset.source + (after === null ? "" : "?history_after=" + encodeURIComponent(after));
        const r = await fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}});
        if (!r.ok) throw new Error("the console answered " + r.status);
        const data = await r.json();
        step = data.history_step;
        draw(root, data, trend);
        error.hidden = true;
      } catch (e) {
        error.textContent = "not refreshed: " + e.message;
        error.hidden = false;
      }
      setTimeout(poll, Number(root.dataset.pollMs));
    }
    setTimeout(poll, Number(root.dataset.pollMs));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
