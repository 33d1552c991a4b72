/* The append tree's drawing on a partition's page (queues/admin/partitions.py).

   Zoom buttons: the SVG has a viewBox, so setting its width and height scales it; its box
   scrolls sideways when the drawing is wider. "fit" scales it to the box's width.

   A block clicked (or Enter on it) shows its messages in the panel beside the drawing: their
   IDs and states (ready, in flight, delayed, dead letter, gone), read from the partition's
   owner through the console's JSON (the box's data-block-url, BLOCK standing for the block).
   "head" and "oldest live" scroll the drawing to the block so marked and list its messages. */
(function () {
  "use strict";
  const STATES = {ready: "ready", in_flight: "in flight", delayed: "delayed", dead_letter: "dead letter", gone: "gone"};

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function setUpZoom(zoom, svg) {
    const box = zoom.querySelector(".tree-box");
    const controls = zoom.querySelector(".tree-controls");
    if (!box || !controls) return;
    const w = svg.viewBox.baseVal.width, h = svg.viewBox.baseVal.height;
    let scale = 1;
    function apply(s) {
      scale = Math.min(4, Math.max(0.05, s));
      svg.setAttribute("width", (w * scale).toFixed(0));
      svg.setAttribute("height", (h * scale).toFixed(0));
      zoom.dataset.scale = scale.toFixed(3);
      controls.querySelector(".tree-scale").textContent = Math.round(scale * 100) + "%";
    }
    controls.hidden = false;
    controls.addEventListener("click", e => {
      const b = e.target.closest("button[data-zoom]");
      if (!b) return;
      const how = b.dataset.zoom;
      if (how === "in") apply(scale * 1.25);
      else if (how === "out") apply(scale / 1.25);
      else if (how === "fit") apply(Math.min(1, (box.clientWidth - 4) / w));
      else apply(Number(how));
    });
    apply(w > box.clientWidth ? Math.max(0.5, (box.clientWidth - 4) / w) : 1);
  }

  function showListing(panel, data) {
    const summary = panel.querySelector(".tree-block-summary");
    const list = panel.querySelector(".tree-block-messages");
    list.replaceChildren();
    if (!data.messages.length) {
      summary.textContent = data.unscanned
        ? "The owner has not read this block since it took the partition over; try again in a moment."
        : "No message of this block is held any more (acknowledged, expired or moved).";
      return;
    }
    const held = data.messages.filter(m => Object.values(m.states).some(s => s !== "gone")).length;
    summary.textContent = `${held} of ${data.used} positions held` + (data.head ? " (the head: enqueues go here)" : "")
      + (data.more ? `; the first ${data.messages.length} listed` : "");
    const readers = Object.keys(data.messages[0].states);
    for (const m of data.messages) {
      const li = el("li");
      li.dataset.id = m.id;
      li.appendChild(el("code", "", m.id));
      for (const reader of readers) {
        const state = m.states[reader];
        const tag = el("span", `state state-${state}`, (reader ? reader + ": " : "") + (STATES[state] || state));
        tag.dataset.state = state;
        if (reader) tag.dataset.reader = reader;
        const extra = [];
        if (m.receive_counts && m.receive_counts[reader]) extra.push(`received ${m.receive_counts[reader]}\u00d7`);
        if (m.visible_in && m.visible_in[reader] !== undefined) extra.push(`visible again in ${Math.round(m.visible_in[reader])} s`);
        if (extra.length) tag.title = extra.join(", ");
        li.appendChild(tag);
        if (extra.length) li.appendChild(el("span", "state-detail", " " + extra.join(", ")));
      }
      if (m.archived) li.appendChild(el("span", "state-detail", " (body in the archive)"));
      list.appendChild(li);
    }
  }

  function setUpBlocks(zoom, svg) {
    const url = zoom.dataset.blockUrl;
    const panel = zoom.querySelector(".tree-block-panel");
    if (!url || !panel) return null;
    let asked = 0;
    async function open(g) {
      const id = g.dataset.id;
      svg.querySelectorAll("g.block.selected").forEach(b => b.classList.remove("selected"));
      g.classList.add("selected");
      panel.hidden = false;
      panel.dataset.block = id;
      panel.removeAttribute("data-loaded");
      panel.querySelector(".tree-block-title").textContent = "Block #" + (id.split("-")[0].replace(/^0+/, "") || "0");
      panel.querySelector(".tree-block-summary").textContent = "Asking the partition's owner\u2026";
      panel.querySelector(".tree-block-messages").replaceChildren();
      const mine = ++asked;
      let text;
      try {
        const r = await fetch(url.replace("BLOCK", encodeURIComponent(id)), {credentials: "same-origin", headers: {Accept: "application/json"}});
        const data = await r.json().catch(() => ({error: r.statusText}));
        if (mine !== asked) return;  // another block was clicked meanwhile
        if (!r.ok) text = `Not shown: ${data.detail || data.error || r.status}`;
        else showListing(panel, data);
      } catch (e) {
        if (mine !== asked) return;
        text = `Not shown: ${e}`;
      }
      if (text) panel.querySelector(".tree-block-summary").textContent = text;
      panel.dataset.loaded = id;
    }
    svg.addEventListener("click", e => {
      const g = e.target.closest("g.block");
      if (g) open(g);
    });
    svg.addEventListener("keydown", e => {
      const g = e.target.closest("g.block");
      if (g && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); open(g); }
    });
    panel.querySelector(".tree-block-close").addEventListener("click", () => {
      panel.hidden = true;
      svg.querySelectorAll("g.block.selected").forEach(b => b.classList.remove("selected"));
    });
    return open;
  }

  /* "head" and "oldest live": scroll the drawing to the marked block and list its messages. */
  function setUpGoto(zoom, svg, open) {
    const controls = zoom.querySelector(".tree-controls");
    if (!controls) return;
    controls.addEventListener("click", e => {
      const b = e.target.closest("button[data-goto]");
      if (!b) return;
      const mark = svg.querySelector(`text.mark-${b.dataset.goto}`);
      const g = mark && svg.querySelector(`g.block[data-id="${mark.dataset.block}"]`);
      if (!g) return;
      g.scrollIntoView({block: "nearest", inline: "center"});
      if (open) open(g);
    });
  }

  function setUp(zoom) {
    const svg = zoom.querySelector("svg.append-tree");
    if (!svg) return;
    setUpZoom(zoom, svg);
    setUpGoto(zoom, svg, setUpBlocks(zoom, svg));
  }
  function start() { document.querySelectorAll(".tree-zoom").forEach(setUp); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
