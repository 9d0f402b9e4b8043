"""diff.html's drawing: a viewer that zooms, pans and finds nodes, and a panel per node.

The error-coloured drawing of a whole model is tall: fitted to a phone it is scaled to
about a quarter, its labels 3 px high. So it sits in a box of its own that zooms (wheel,
pinch, the + / − / fit buttons) and pans (drag, one finger) by changing the SVG's
``viewBox``, and a search box highlights and centres the nodes whose name matches. A
click or tap on a node opens a panel: each reference node drawn there, its counterpart,
shape, dtype, status, errors and budget, and two histograms of ``|cand - ref|`` per
decade (local and propagated) that the diff counted on the real tokens
(``introspect.diff.histogram``), embedded as JSON.

Pointer events serve mouse, pen and touch alike; the script is written here, inline, and
fetches nothing. Without script the drawing still shows, fitted to its box.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from introspect.diff.histogram import ERROR_BINS
from introspect.diff.records import STATUS_SKIPPED, STATUS_UNMATCHED
from introspect.diff.status import status_word

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

DRAWING_CSS = """
.drawing-area { display: grid; grid-template-columns: minmax(0, 1fr); gap: .8em;
  position: relative; }
@media (min-width: 960px) {
  .drawing-area.open { grid-template-columns: minmax(0, 1fr) 360px; }
}
@media (max-width: 959px) {  /* a sheet over the drawing's lower part, as maps do */
  .node-panel { position: absolute; left: 0; right: 0; bottom: 0; max-height: 55% !important;
    background: #fff; box-shadow: 0 -2px 10px rgba(0, 0, 0, .18); }
}
.drawing-tools { display: flex; flex-wrap: wrap; gap: .4em; align-items: center; margin: .4em 0; }
.drawing-tools button { font: inherit; min-width: 2.4em; min-height: 2.2em; padding: 0 .6em;
  border: 1px solid #d0d7de; border-radius: 6px; background: #f6f8fa; cursor: pointer; }
.drawing-tools input[type=search] { font: inherit; padding: 3px 6px; width: 18em;
  max-width: 100%; box-sizing: border-box; }
#drawing-found { color: #59636e; font-size: .9em; }
.drawing { border: 1px solid #d0d7de; height: min(78vh, 900px); min-height: 320px;
  overflow: hidden; touch-action: none; cursor: grab; background: #fff; position: relative; }
.drawing.dragging { cursor: grabbing; }
.drawing svg { width: 100%; height: 100%; display: block; user-select: none; }
.drawing g.node { cursor: pointer; }
.drawing g.node.hit polygon, .drawing g.node.hit ellipse, .drawing g.node.hit path {
  stroke: #0969da; stroke-width: 4px; }
.drawing g.node.selected polygon, .drawing g.node.selected ellipse,
.drawing g.node.selected path { stroke: #8250df; stroke-width: 6px; }
.node-panel { border: 1px solid #d0d7de; border-radius: 6px; padding: .6em .8em;
  font-size: .88em; max-height: min(78vh, 900px); overflow: auto; box-sizing: border-box; }
.node-panel[hidden] { display: none; }
.node-panel header { display: flex; justify-content: space-between; gap: .5em; align-items: start; }
.node-panel h3 { font-size: 1.05em; margin: 0 0 .4em; overflow-wrap: anywhere; }
.node-panel .pair { border-top: 1px solid #d0d7de; padding: .4em 0; }
.node-panel dl { display: grid; grid-template-columns: auto minmax(0, 1fr); gap: 0 .8em;
  margin: .3em 0; }
.node-panel dt { color: #59636e; } .node-panel dd { margin: 0; overflow-wrap: anywhere; }
.node-panel .hist text { font-size: 9px; fill: #59636e; }
.node-panel .hist .bar { fill: #0969da; } .node-panel .hist .bar.zero { fill: #1a7f37; }
.node-panel .hist .over { fill: #cf222e; }
"""

# The viewer. `view` is the visible part of the drawing in SVG units, kept at the box's
# aspect ratio, so that a screen point maps linearly to a drawing point.
DRAWING_SCRIPT = r"""
(function () {
  var box = document.getElementById("drawing-box");
  if (!box) return;
  var svg = box.querySelector("svg");
  var data = JSON.parse(document.getElementById("drawing-data").textContent);
  var area = document.getElementById("drawing-area");
  var panel = document.getElementById("node-panel");
  var base = svg.viewBox.baseVal;
  var full = {x: base.x, y: base.y, w: base.width, h: base.height};
  var view = null;
  svg.removeAttribute("width"); svg.removeAttribute("height");
  function aspect() { return Math.max(box.clientHeight, 1) / Math.max(box.clientWidth, 1); }
  function show() {
    svg.setAttribute("viewBox", [view.x, view.y, view.w, view.h].map(function (v) {
      return v.toFixed(2); }).join(" "));
  }
  function fit() {
    var a = aspect(), w = full.w, h = full.w * a;
    if (h < full.h) { h = full.h; w = full.h / a; }
    view = {x: full.x - (w - full.w) / 2, y: full.y - (h - full.h) / 2, w: w, h: h};
    show();
  }
  // The view at the box's aspect again (the box changed size: a window resized, the
  // panel opened beside it), around the same centre.
  function reaspect() {
    var cx = view.x + view.w / 2, cy = view.y + view.h / 2;
    view.h = view.w * aspect(); view.x = cx - view.w / 2; view.y = cy - view.h / 2; show();
  }
  // A point of the screen in drawing units.
  function toDrawing(px, py) {
    var p = svg.createSVGPoint(); p.x = px; p.y = py;
    return p.matrixTransform(svg.getScreenCTM().inverse());
  }
  // Zoom by `factor` (> 1: closer) keeping the drawing point under (px, py) in place.
  function zoomAt(factor, px, py) {
    var r = box.getBoundingClientRect(), at = toDrawing(px, py);
    var fx = (at.x - view.x) / view.w, fy = (at.y - view.y) / view.h;
    var w = Math.min(Math.max(view.w / factor, full.w / 400, 20), full.w * 4);
    var h = w * aspect();
    view = {x: at.x - fx * w, y: at.y - fy * h, w: w, h: h};
    show();
  }
  function zoomCentre(factor) {
    var r = box.getBoundingClientRect();
    zoomAt(factor, r.left + r.width / 2, r.top + r.height / 2);
  }
  function panBy(dx, dy) {
    var r = box.getBoundingClientRect();
    view.x -= dx * view.w / r.width; view.y -= dy * view.h / r.height;
    show();
  }
  // Centre a node in the part of the box the panel leaves free, close enough to read
  // (1 drawing unit = 1 CSS pixel at least).
  function centre(node) {
    reaspect();
    var r = box.getBoundingClientRect(), n = node.getBoundingClientRect();
    var at = toDrawing(n.left + n.width / 2, n.top + n.height / 2);
    var free = r.height;
    if (!panel.hidden) {
      var p = panel.getBoundingClientRect();
      if (p.top > r.top && p.top < r.bottom && p.left < r.right && p.right > r.left) {
        free = p.top - r.top;
      }
    }
    var w = Math.min(view.w, r.width), h = w * aspect();
    view = {x: at.x - w / 2, y: at.y - (free / 2) * h / r.height, w: w, h: h};
    show();
  }
  fit();
  window.addEventListener("resize", reaspect);
  if (window.ResizeObserver) new ResizeObserver(reaspect).observe(box);
  document.querySelectorAll(".drawing-tools button[data-zoom]").forEach(function (b) {
    b.addEventListener("click", function () {
      var how = b.dataset.zoom;
      if (how === "in") zoomCentre(1.5); else if (how === "out") zoomCentre(1 / 1.5); else fit();
    });
  });
  box.addEventListener("wheel", function (e) {
    e.preventDefault();
    var lines = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? 400 : 1;
    zoomAt(Math.exp(-e.deltaY * lines * 0.0015), e.clientX, e.clientY);
  }, {passive: false});
  // Pointers: one drags, two pinch; a press that barely moves is a tap on a node.
  var pointers = new Map(), pressed = null, travelled = 0;
  box.addEventListener("pointerdown", function (e) {
    if (e.button !== undefined && e.button > 0) return;
    pointers.set(e.pointerId, {x: e.clientX, y: e.clientY});
    if (pointers.size === 1) { pressed = e.target; travelled = 0; }
    try { box.setPointerCapture(e.pointerId); } catch (err) { /* not an active pointer */ }
    box.classList.add("dragging");
  });
  box.addEventListener("pointermove", function (e) {
    var last = pointers.get(e.pointerId);
    if (!last) return;
    var now = {x: e.clientX, y: e.clientY};
    travelled += Math.abs(now.x - last.x) + Math.abs(now.y - last.y);
    if (pointers.size === 1) {
      panBy(now.x - last.x, now.y - last.y);
    } else if (pointers.size === 2) {
      var other = null;
      pointers.forEach(function (p, id) { if (id !== e.pointerId) other = p; });
      var before = Math.hypot(last.x - other.x, last.y - other.y);
      var after = Math.hypot(now.x - other.x, now.y - other.y);
      panBy((now.x - last.x) / 2, (now.y - last.y) / 2);
      if (before > 0) zoomAt(after / before, (now.x + other.x) / 2, (now.y + other.y) / 2);
    }
    pointers.set(e.pointerId, now);
  });
  function release(e) {
    if (!pointers.delete(e.pointerId)) return;
    if (pointers.size === 0) {
      box.classList.remove("dragging");
      if (e.type === "pointerup" && travelled < 8 && pressed) {
        var node = pressed.closest ? pressed.closest("g.node") : null;
        if (node) select(node);
      }
      pressed = null;
    } else { travelled = Infinity; }  // a pinch is no tap
  }
  box.addEventListener("pointerup", release);
  box.addEventListener("pointercancel", release);
  // Search: every node whose name (or a name drawn in it) holds the text is highlighted;
  // Enter goes to the next one.
  var nodes = Array.prototype.slice.call(svg.querySelectorAll("g.node"));
  function names(node) {
    var id = node.querySelector("title").textContent;
    return [id].concat(data.groups[id] || []);
  }
  var hits = [], at = -1;
  function search(step) {
    var text = document.getElementById("drawing-search").value.trim().toLowerCase();
    var found = document.getElementById("drawing-found");
    if (!step) {
      nodes.forEach(function (n) { n.classList.remove("hit"); });
      hits = !text ? [] : nodes.filter(function (n) {
        return names(n).some(function (name) {
          var pairs = data.nodes[name] || [];
          return name.toLowerCase().indexOf(text) >= 0 || pairs.some(function (p) {
            return p.candidate.toLowerCase().indexOf(text) >= 0; });
        });
      });
      hits.forEach(function (n) { n.classList.add("hit"); });
      at = -1;
    }
    if (!hits.length) { found.textContent = text ? "no node matches" : ""; return; }
    at = (at + 1) % hits.length;
    found.textContent = (at + 1) + " of " + hits.length;
    centre(hits[at]);
  }
  var field = document.getElementById("drawing-search");
  field.addEventListener("input", function () { search(false); });
  field.addEventListener("keydown", function (e) {
    if (e.key === "Enter") { e.preventDefault(); search(true); }
  });
  // The panel of a node: each reference node drawn there, with its pairs.
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
  }
  function num(v) {  // three significant digits; "inf" and "nan" come as text
    return v === null ? "n/a" : typeof v === "string" ? v : String(Number(v.toPrecision(3)));
  }
  function compact(c) {
    return c >= 1e6 ? (c / 1e6).toFixed(1) + "M" : c >= 1e4 ? Math.round(c / 1e3) + "k" : String(c);
  }
  // Bars per decade of |cand - ref|, heights on a log scale; the budget's decade in red.
  function histogram(counts, atol, label) {
    var bins = data.bins, bw = 22, top = 16, hh = 60, left = 4, most = Math.max.apply(null, counts);
    var width = left + bins.length * bw + 4, out = "";
    var budget = atol > 0 ? Math.floor(Math.log10(atol)) : null;
    counts.forEach(function (c, i) {
      var x = left + i * bw, h = c > 0 ? Math.max(2, hh * Math.log(1 + c) / Math.log(1 + most)) : 0;
      var decade = i >= 2 && i <= 12 ? i - 12 : null;
      out += '<rect class="bar' + (i === 0 ? " zero" : "") + '" x="' + (x + 2) + '" y="' +
        (top + hh - h) + '" width="' + (bw - 4) + '" height="' + h + '"><title>' +
        esc(bins[i]) + ": " + c + " elements</title></rect>";
      if (c > 0) out += '<text x="' + (x + bw / 2) + '" y="' + (top + hh - h - 3) +
        '" text-anchor="middle">' + compact(c) + "</text>";
      if (decade !== null && decade === budget) out += '<rect class="over" x="' + x +
        '" y="' + (top + hh + 1) + '" width="' + bw + '" height="3"><title>atol ' + atol +
        " is in this decade</title></rect>";
      out += '<text x="' + (x + bw / 2) + '" y="' + (top + hh + 14) + '" text-anchor="middle">' +
        esc(i === 0 ? "=0" : bins[i].replace("1e", "")) + "</text>";
    });
    return "<figure style='margin:.3em 0'><figcaption>" + esc(label) + "</figcaption>" +
      '<svg class="hist" width="' + width + '" height="' + (top + hh + 18) + '" viewBox="0 0 ' +
      width + " " + (top + hh + 18) + '">' + out + "</svg></figure>";
  }
  function pairHtml(name, p) {
    var rows = [["candidate", p.candidate || "none"], ["op", p.op], ["layer", p.layer],
      ["shape", p.shape], ["dtype", p.dtype], ["status", p.status],
      ["local max abs err", num(p.local)], ["max abs err", num(p.max)],
      ["budget", p.atol === null ? "n/a" : "atol " + num(p.atol) + " + rtol " + num(p.rtol) +
        " \u00d7 |ref|"]];
    if (p.note) rows.push(["note", p.note]);
    var out = "<div class='pair'><b><code>" + esc(name) + "</code></b><dl>" +
      rows.map(function (r) { return "<dt>" + esc(r[0]) + "</dt><dd>" + esc(r[1]) + "</dd>"; })
        .join("") + "</dl>";
    if (p.hist_local) {
      var same = p.hist_local.join() === p.hist_max.join();
      out += histogram(p.hist_local, p.atol, (same ? "|cand \u2212 ref|" : "local |cand \u2212 " +
        "ref|") + ": elements exactly equal (=0), then per decade 10^k" +
        (same ? " (local and propagated alike)" : ""));
      if (!same) out += histogram(p.hist_max, p.atol, "propagated |cand \u2212 ref|, per decade");
      out += "<p class='notes'>Real tokens only; heights on a log scale; a red mark under " +
        "the decade of atol.</p>";
    } else if (p.status !== "n/a") {
      out += "<p>No histogram was recorded for this pair.</p>";
    }
    return out + "</div>";
  }
  var shown = 12;  // pairs listed per drawn node, worst first
  function select(node) {
    nodes.forEach(function (n) { n.classList.toggle("selected", n === node); });
    var id = node.querySelector("title").textContent, members = data.groups[id] || [id];
    var pairs = [];
    members.forEach(function (name) {
      (data.nodes[name] || []).forEach(function (p) { pairs.push([name, p]); });
    });
    function worse(p) { var r = p[1].ratio; return typeof r === "string" ? Infinity : r || 0; }
    pairs.sort(function (a, b) { return worse(b) - worse(a); });
    var out = "<header><h3>" + esc(id) + "</h3><button type='button' id='node-panel-close'>" +
      "close</button></header><p>" + members.length + " reference node(s) drawn here; " +
      pairs.length + " compared" + (pairs.length > shown ? ", the " + shown +
      " worst shown" : "") + ".</p>";
    out += pairs.slice(0, shown).map(function (p) { return pairHtml(p[0], p[1]); }).join("");
    panel.innerHTML = out;
    panel.hidden = false;
    area.classList.add("open");
    document.getElementById("node-panel-close").addEventListener("click", function () {
      panel.hidden = true; area.classList.remove("open");
      nodes.forEach(function (n) { n.classList.remove("selected"); });
    });
  }
  // Fit the view to one part of the drawing (a failing layer's outline), with a margin.
  function frame(element) {
    reaspect();
    var r = element.getBoundingClientRect();
    var a = toDrawing(r.left, r.top), b = toDrawing(r.right, r.bottom);
    var w = (b.x - a.x) * 1.08, h = (b.y - a.y) * 1.08;
    if (h / w > aspect()) w = h / aspect(); else h = w * aspect();
    var top = Math.max(a.y - (b.y - a.y) * 0.04, (a.y + b.y) / 2 - h / 2);  // its top in view
    view = {x: (a.x + b.x) / 2 - w / 2, y: top, w: w, h: h};
    show();
  }
  // A link into the box scrolls it, though it hides its overflow: the view moves instead.
  box.addEventListener("scroll", function () { box.scrollTop = 0; box.scrollLeft = 0; });
  // diff.html#node=NAME opens on that node: centred, its panel open (the first
  // divergence links there); #outline_LAYER fits the view to that failing layer.
  function opening() {
    var hash = decodeURIComponent(location.hash.slice(1));
    var outline = hash.indexOf("outline_") === 0 ? document.getElementById(hash) : null;
    if (outline && box.contains(outline)) {
      box.scrollIntoView(); frame(outline); return;
    }
    if (hash.indexOf("node=") !== 0) return;
    var name = hash.slice(5), node = nodes.filter(function (n) {
      return names(n).indexOf(name) >= 0; })[0];
    if (!node) return;
    select(node);  // first: the open panel narrows the box
    document.getElementById("drawing").scrollIntoView();
    centre(node);
  }
  window.addEventListener("hashchange", opening);
  if (document.readyState === "complete") opening();
  else window.addEventListener("load", opening);
  window.introspectDrawing = {fit: fit, zoom: zoomCentre, select: select,
    search: function (text) { field.value = text; search(false); },
    view: function () { return view; }};
})();
"""


def drawing_section(result: DiffResult, svg: bytes,
                    members: Mapping[str, Sequence[str]]) -> list[str]:
    """The drawing's heading, tools, box, panel and data (the script goes at the end)."""
    text = svg.decode("utf-8")
    text = text[text.find("<svg"):] if "<svg" in text else text
    return ["<h2 id='drawing'>Drawing</h2>",
            "<p class='notes'>Each node coloured by its local error against its "
            "budget: green within, yellow up to 10x, orange up to 1000x, red beyond. "
            "Failing layers are drawn open, with a thick red border. Drag to pan; wheel, "
            "pinch or the buttons to zoom; click or tap a node for its errors and their "
            "histogram. <a href='diff.svg'>The drawing on its own</a>.</p>",
            "<div class='drawing-tools'>"
            "<button type='button' data-zoom='in' aria-label='zoom in'>+</button>"
            "<button type='button' data-zoom='out' aria-label='zoom out'>\u2212</button>"
            "<button type='button' data-zoom='fit' aria-label='fit the drawing'>fit</button>"
            "<input type='search' id='drawing-search' placeholder='find a node by name' "
            "aria-label='find a node by name'> <span id='drawing-found'></span></div>",
            "<div class='drawing-area' id='drawing-area'>",
            f"<div class='drawing' id='drawing-box'>{text}</div>",
            "<aside class='node-panel' id='node-panel' hidden aria-live='polite'></aside>",
            "</div>",
            f"<script type='application/json' id='drawing-data'>{_data_json(result, members)}"
            "</script>"]


def drawing_data(result: DiffResult,
                 members: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """What the panel shows, by reference node: each pair (or the reason it has none)."""
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in result.rows:
        if r.status == STATUS_SKIPPED or not r.reference_node:
            continue
        compared = r.status != STATUS_UNMATCHED
        hists = result.histograms.get((r.reference_node, r.candidate_node)) if compared else None
        ratio = None
        if compared and r.local_max_abs_err is not None and r.atol:
            ratio = r.local_max_abs_err / r.atol
        by_node.setdefault(r.reference_node, []).append({
            "candidate": r.candidate_node, "op": r.op, "layer": r.layer, "shape": r.shape,
            "dtype": r.dtype, "status": status_word(r.status),
            "local": _number(r.local_max_abs_err) if compared else None,
            "max": _number(r.max_abs_err) if compared else None,
            "atol": _number(r.atol), "rtol": _number(r.rtol), "ratio": _number(ratio),
            "note": r.note,
            "hist_local": list(hists[0]) if hists else None,
            "hist_max": list(hists[1]) if hists else None,
        })
    return {"bins": list(ERROR_BINS), "nodes": by_node,
            "groups": {k: list(v) for k, v in members.items()}}


def _data_json(result: DiffResult, members: Mapping[str, Sequence[str]]) -> str:
    """The data as JSON that no name can end the script with (``<`` escaped)."""
    text = json.dumps(drawing_data(result, members), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _number(value: float | None) -> float | str | None:
    """A number as strict JSON holds it: Inf and NaN as the text "inf", "nan"."""
    return value if value is None or math.isfinite(value) else str(value)


__all__ = ["DRAWING_CSS", "DRAWING_SCRIPT", "drawing_data", "drawing_section"]
