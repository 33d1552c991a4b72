/* The append tree's drawing on a partition's page (queues/admin/partitions.py): zoom buttons.
   The SVG has a viewBox, so setting its width and height scales it; its box scrolls sideways
   when the drawing is wider. "fit" scales it to the box's width. */
(function () {
  "use strict";
  function setUp(zoom) {
    const svg = zoom.querySelector("svg.append-tree");
    const box = zoom.querySelector(".tree-box");
    const controls = zoom.querySelector(".tree-controls");
    if (!svg || !box || !controls) return;
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
  function start() { document.querySelectorAll(".tree-zoom").forEach(setUp); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
