"""The page's inline stylesheet and script (no network: everything the page needs is in
these two strings). In: nothing. Out: :data:`CSS` and :data:`JS`.

The script reads the JSON block ``#rlx-data`` (blocks with their rows and expanded
sizes, block edges, node facts), stacks the blocks in rows, draws the edges between
blocks of adjacent rows, and handles expand / collapse, search, selection (the details
panel), the legend highlight, the memory bars (click: show the node) and zoom.
"""

from __future__ import annotations

__all__ = ["CSS", "JS"]

CSS = """
:root{--bg:#f4f6f8;--panel:#fff;--ink:#1f2933;--muted:#616e7c;--line:#d9dee5;
--accent:#2f6fde;--hit:#e12d39}
*{box-sizing:border-box}
body{margin:0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",
Arial,sans-serif;color:var(--ink);background:var(--bg)}
header{padding:12px 20px;background:#1f2933;color:#f5f7fa;display:flex;align-items:baseline;
gap:18px;flex-wrap:wrap}
header h1{font-size:17px;margin:0;font-weight:600}
header .meta{color:#b8c2cc;font-size:12.5px}
.toolbar{display:flex;gap:8px;align-items:center;padding:8px 20px;background:var(--panel);
border-bottom:1px solid var(--line);position:sticky;top:0;z-index:5}
.toolbar input{width:300px;padding:5px 9px;border:1px solid #b8c2cc;border-radius:6px;font:inherit}
.toolbar button{padding:4px 10px;border:1px solid #b8c2cc;background:#fff;border-radius:6px;
font:inherit;cursor:pointer;color:var(--ink)}
.toolbar button:hover{border-color:var(--accent);color:var(--accent)}
.toolbar .count{color:var(--muted);min-width:90px}
.toolbar .spacer{flex:1}
main{display:flex;gap:14px;padding:14px 20px;align-items:flex-start}
#graph-pane{flex:1;min-width:0;background:var(--panel);border:1px solid var(--line);
border-radius:10px;overflow:hidden}
#graph-scroll{overflow:auto;height:72vh;min-height:420px}
#graph{display:block;margin:0 auto}
aside{width:330px;flex:none;display:flex;flex-direction:column;gap:12px}
aside section,.pane{background:var(--panel);border:1px solid var(--line);border-radius:10px;
padding:10px 14px}
h2{font-size:13px;margin:0 0 8px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
ul.legend{list-style:none;margin:0;padding:0}
ul.legend li{display:flex;align-items:center;gap:8px;padding:3px 4px;border-radius:5px;cursor:pointer}
ul.legend li:hover,ul.legend li.on{background:#eef2f7}
ul.legend .sw{width:14px;height:14px;border-radius:3px;flex:none}
ul.legend .n{margin-left:auto;color:var(--muted);font-variant-numeric:tabular-nums;
white-space:nowrap;font-size:12px}
ul.legend .g{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.empty{color:var(--muted);font-style:italic}
#details dl{display:grid;grid-template-columns:78px 1fr;gap:3px 8px;margin:0}
#details dt{color:var(--muted)}
#details dd{margin:0;word-break:break-word}
#details code,.mono{font:11.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
#details ul{margin:0;padding-left:16px}
.pane{margin:0 20px 14px}
.pane p{margin:4px 0 8px;color:var(--muted)}
#memory-scroll{overflow-x:auto}
details.pane summary{cursor:pointer;font-weight:600}
details.pane pre{max-height:340px;overflow:auto;font-size:11.5px;background:#f8fafc;
padding:8px;border-radius:6px}
footer{color:var(--muted);font-size:11.5px;padding:0 20px 18px}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}
.node{cursor:pointer}
.node .box{fill:#fff;stroke:#aab4c0;stroke-width:1}
.node.fused .box{fill:var(--gt);stroke:var(--g);stroke-width:1.4}
.node .stripe{fill:var(--g)}
.node.input .box{fill:#eaf0f7;stroke:#7b8da6}
.node.out .box{stroke:#1f2933;stroke-width:2}
.node .op{font-weight:600;font-size:12px;fill:#1f2933}
.node .nid{font-size:11px;fill:#7b8794}
.node .shape,.ghost-text{font:11px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;fill:#52606d}
.node .out-tag{font-size:10.5px;font-weight:600;fill:#1f2933}
.badge{fill:#f0b429}.badge-text{font-size:10px;font-weight:700;fill:#3d2e00}
.node:hover .box{stroke:var(--accent)}
.node.hl .box{stroke-width:3}
.node.hit .box{stroke:var(--hit);stroke-width:3}
.node.selected .box{stroke:var(--accent);stroke-width:3.2}
.edge{fill:none;stroke:#9aa5b1;stroke-width:1.2}
.ghost-edge{stroke-dasharray:4 3}
.arrowhead{fill:#8a96a3}
.ghost{cursor:pointer}
.ghost-box{fill:#fff;stroke:#9aa5b1;stroke-dasharray:4 3}
.block-frame{fill:#fafbfc;stroke:#c5ccd6}
.block-head-bg{fill:#e6ebf1}
.block-box{fill:#fff;stroke:#b8c2cc;stroke-width:1.2}
.block-title{font-weight:600;font-size:13px;fill:#1f2933}
.block-sub{font-size:11px;fill:#616e7c}
.chev{font-size:16px;font-weight:700;fill:#616e7c}
.collapsed,.block-header{cursor:pointer}
.collapsed:hover .block-box{stroke:var(--accent);stroke-width:2}
.block-header:hover .block-head-bg{fill:#dbe3ec}
.block.has-hit .block-box{stroke:var(--hit);stroke-width:2.5}
.block-edge{fill:none;stroke:#7b8794;stroke-width:1.6}
.mem-bg{fill:#fff;stroke:#d9dee5}.grid{stroke:#edf0f3}
.axis{font-size:10.5px;fill:#7b8794}.axis-title{font-size:11px;fill:#616e7c}
.live{fill:#e6ebf1}
.buf{stroke:#fff;stroke-width:.5;cursor:pointer}
.buf:hover,.buf.hl{stroke:#1f2933;stroke-width:1.2}
.buf.sel{stroke:var(--accent);stroke-width:2}
.peak{stroke:var(--hit);stroke-dasharray:6 4;stroke-width:1.4}
.peak-step{stroke:var(--hit);stroke-width:1;stroke-dasharray:2 3}
.peak-label{font-size:11px;fill:#b3261e;font-weight:600}
"""

JS = r"""
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("rlx-data").textContent);
  const svg = document.getElementById("graph");
  const scroller = document.getElementById("graph-scroll");
  const blocks = DATA.blocks;
  const M = 18, GAP = 28, VGAP = 34, CW = DATA.collapsed[0], CH = DATA.collapsed[1];
  let zoom = 1, selected = null, hits = [], hitAt = -1;
  const size = (b) => (b.expanded ? [b.ew, b.eh] : [CW, CH]);
  let pos = {};

  function reflow() {
    const rows = new Map();
    for (const b of blocks) {
      if (!rows.has(b.row)) rows.set(b.row, []);
      rows.get(b.row).push(b);
    }
    const keys = [...rows.keys()].sort((a, b) => a - b);
    const rowW = (r) => r.reduce((s, b) => s + size(b)[0], 0) + GAP * (r.length - 1);
    let W = 0;
    for (const k of keys) W = Math.max(W, rowW(rows.get(k)));
    let y = M;
    pos = {};
    for (const k of keys) {
      const r = rows.get(k);
      let x = M + (W - rowW(r)) / 2, h = 0;
      for (const b of r) {
        const [bw, bh] = size(b);
        pos[b.i] = [x, y, bw, bh];
        x += bw + GAP;
        h = Math.max(h, bh);
      }
      y += h + VGAP;
    }
    for (const b of blocks) {
      const g = document.getElementById("b-" + b.i);
      const p = pos[b.i];
      g.setAttribute("transform", "translate(" + p[0] + "," + p[1] + ")");
      g.querySelector(".collapsed").style.display = b.expanded ? "none" : "";
      g.querySelector(".expanded").style.display = b.expanded ? "" : "none";
    }
    let paths = "";
    for (const [a, c] of DATA.block_edges) {
      if (blocks[c].row !== blocks[a].row + 1) continue;
      const p = pos[a], q = pos[c];
      const x1 = p[0] + p[2] / 2, y1 = p[1] + p[3], x2 = q[0] + q[2] / 2, y2 = q[1];
      const m = (y2 - y1) / 2;
      paths += '<path class="block-edge" d="M' + x1 + "," + y1 + " C" + x1 + "," + (y1 + m) +
        " " + x2 + "," + (y2 - m) + " " + x2 + "," + y2 + '" marker-end="url(#arrow)"/>';
    }
    document.getElementById("block-edges").innerHTML = paths;
    const w = W + 2 * M, h = Math.max(y - VGAP + M, 2 * M);
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("width", w * zoom);
    svg.setAttribute("height", h * zoom);
    document.getElementById("zoom-level").textContent = Math.round(zoom * 100) + "%";
  }

  function setExpanded(i, on) {
    blocks[i].expanded = on;
  }

  function reveal(id) {
    const n = DATA.nodes[id];
    if (!n) return null;
    if (!blocks[n.b].expanded) {
      setExpanded(n.b, true);
      reflow();
    }
    return document.getElementById("n-" + id);
  }

  function esc(s) {
    return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }

  function showDetails(id) {
    const n = DATA.nodes[id];
    const box = document.getElementById("details");
    if (!n) { box.innerHTML = '<span class="empty">Click a node.</span>'; return; }
    const rows = [["node", "<code>" + esc(n.t) + "</code>"], ["op", esc(n.op)],
      ["shape", "<code>" + esc(n.s) + "</code>"], ["dtype", esc(n.d)],
      ["precision", esc(n.p || (n.d === "f32" ? "f32" : n.d))], ["block", esc(blocks[n.b].name)]];
    if (n.g) rows.push(["fused", esc(n.g) + "<ul>" + n.f.map((x) => "<li><code>" + esc(x) + "</code></li>").join("") + "</ul>"]);
    if (n.k) rows.push(["kernel", esc(n.k)]);
    if (n.sl) rows.push(["arena slot", "<code>" + esc(n.sl) + "</code>"]);
    if (n.src) rows.push(["source", "<code>" + esc(n.src) + "</code>"]);
    if (n.o !== null && n.o !== undefined) rows.push(["output", "#" + n.o]);
    if (n.r.length) rows.push(["reads", "<ul>" + n.r.map((x) => "<li><code>" + esc(x) + "</code></li>").join("") + "</ul>"]);
    box.innerHTML = "<dl>" + rows.map((r) => "<dt>" + r[0] + "</dt><dd>" + r[1] + "</dd>").join("") + "</dl>";
  }

  function select(id, scroll) {
    if (selected !== null) {
      const old = document.getElementById("n-" + selected);
      if (old) old.classList.remove("selected");
      document.querySelectorAll(".buf.sel").forEach((e) => e.classList.remove("sel"));
    }
    selected = id;
    const el = reveal(id);
    if (el) {
      el.classList.add("selected");
      if (scroll) el.scrollIntoView({ block: "center", inline: "center" });
    }
    const bar = document.querySelector('.buf[data-node="' + id + '"]');
    if (bar) bar.classList.add("sel");
    showDetails(id);
  }

  function search(q) {
    document.querySelectorAll(".node.hit").forEach((e) => e.classList.remove("hit"));
    document.querySelectorAll(".block.has-hit").forEach((e) => e.classList.remove("has-hit"));
    hits = []; hitAt = -1;
    q = q.trim().toLowerCase();
    const count = document.getElementById("search-count");
    if (!q) { count.textContent = ""; return; }
    for (const [id, n] of Object.entries(DATA.nodes)) {
      if (n.q.includes(q) || "%" + id === q) hits.push(id);
    }
    count.textContent = hits.length + (hits.length === 1 ? " match" : " matches");
    let changed = false;
    for (const id of hits.slice(0, 60)) {
      const b = DATA.nodes[id].b;
      if (!blocks[b].expanded) { setExpanded(b, true); changed = true; }
    }
    if (changed) reflow();
    for (const id of hits) {
      document.getElementById("n-" + id).classList.add("hit");
      document.getElementById("b-" + DATA.nodes[id].b).classList.add("has-hit");
    }
    if (hits.length) next();
  }

  function next() {
    if (!hits.length) return;
    hitAt = (hitAt + 1) % hits.length;
    select(hits[hitAt], true);
  }

  svg.addEventListener("click", (ev) => {
    const t = ev.target.closest("[data-toggle], .node, .ghost");
    if (!t) return;
    if (t.classList.contains("node")) { select(t.dataset.id, false); return; }
    if (t.classList.contains("ghost")) { select(t.dataset.ref, true); return; }
    const i = +t.dataset.toggle;
    setExpanded(i, !blocks[i].expanded);
    reflow();
    if (blocks[i].expanded) {  // bring the opened block into view, centred if it is wide
      const p = pos[i];
      scroller.scrollLeft = (p[0] + p[2] / 2) * zoom - scroller.clientWidth / 2;
    }
  });
  document.getElementById("memory-scroll").addEventListener("click", (ev) => {
    const t = ev.target.closest(".buf");
    if (t) select(t.dataset.node, true);
  });
  document.querySelectorAll("#legend-fusion li[data-group]").forEach((li) => {
    li.addEventListener("click", () => {
      const on = !li.classList.contains("on");
      li.classList.toggle("on", on);
      const g = li.dataset.group;
      for (const [id, n] of Object.entries(DATA.nodes)) {
        if (n.g !== g) continue;
        document.getElementById("n-" + id).classList.toggle("hl", on);
        const bar = document.querySelector('.buf[data-node="' + id + '"]');
        if (bar) bar.classList.toggle("hl", on);
      }
    });
  });
  const input = document.getElementById("search");
  let timer = null;
  input.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => search(input.value), 120); });
  input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); if (hits.length) next(); else search(input.value); } });
  document.getElementById("expand-all").addEventListener("click", () => { blocks.forEach((b) => (b.expanded = true)); reflow(); });
  document.getElementById("collapse-all").addEventListener("click", () => { blocks.forEach((b) => (b.expanded = false)); reflow(); });
  document.getElementById("zoom-in").addEventListener("click", () => { zoom = Math.min(zoom * 1.25, 4); reflow(); });
  document.getElementById("zoom-out").addEventListener("click", () => { zoom = Math.max(zoom / 1.25, 0.2); reflow(); });
  document.getElementById("zoom-fit").addEventListener("click", () => {
    const w = +svg.getAttribute("viewBox").split(" ")[2];
    zoom = Math.max(0.2, Math.min(1, (scroller.clientWidth - 24) / w));
    reflow();
  });
  reflow();
  window.rlxView = { reflow, select, search, blocks };
})();
"""
