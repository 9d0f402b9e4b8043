"""A self-contained HTML page to browse attention, with bertviz's three views.

- head view: the tokens twice, a line from each query to each key, every head overlaid in
  its own colour; a toggle per head (double-click: that head alone), a sentence A/B filter
  for text pairs; hover, click or tap a token to see only its lines (a click pins them);
- model view: a grid of layers × heads thumbnails; click or tap one to zoom on it;
- matrix view: one head as a heatmap, with its colour scale; tap a cell to read it;
- neuron view: one head and one query token: the query vector, each key vector, their
  elementwise product, the scores and the weights (``neuron_script``).

``page.html#model`` (or ``#matrix``, ``#neuron``) opens on that view. The page follows the
system's dark mode (``prefers-color-scheme``), and a button switches it.

Everything is inline (data, style, script): no CDN, no fonts, no network, it opens from a
file or a CI artifact, and the same maps give the same bytes. It reads on a phone (390 px):
the drawings scale to the width, the controls wrap. The weights of one batch row are
embedded as bytes (weight × 255, base64), so a page of a 12 × 12 model over 128 tokens
stays near 3 MB; longer rows are cut to ``page_max_tokens`` and the page says so.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from introspect.attention.neuron_script import NEURON_SCRIPT
from introspect.attention.svg import HEAD_COLOURS

if TYPE_CHECKING:
    from introspect.attention.records import AttentionRecord

MAX_EMBEDDED_WEIGHTS = 4_000_000  # layers × heads × n × n bytes, before base64
# The neuron view's queries and keys: layers × heads × n × head size × 2 float16 values.
MAX_EMBEDDED_VECTORS = 1_000_000
SEPARATORS = frozenset({"[SEP]", "</s>"})  # end a sentence: BERT's and RoBERTa's


def page_max_tokens(layers: int, heads: int) -> int:
    """The most tokens whose weights of every layer and head fit the page budget."""
    return max(8, math.isqrt(MAX_EMBEDDED_WEIGHTS // max(layers * heads, 1)))


def page_data(maps: AttentionRecord, batch: int = 0) -> dict[str, object]:
    """What the page's script draws: tokens, sizes and the quantised weights of one row."""
    import numpy as np

    maps.check(batch=batch)
    n_real = maps.length(batch)
    n = min(n_real, page_max_tokens(maps.num_layers, maps.num_heads))
    keep = maps.keep[batch].nonzero().flatten()[:n]
    probs = maps.probs[:, batch][:, :, keep][:, :, :, keep]  # (L, nh, n, n)
    levels = np.rint(np.clip(probs.numpy(), 0.0, 1.0) * 255).astype(np.uint8)
    text = maps.texts[batch] if batch < len(maps.texts) else ""
    return {
        "title": maps.title, "text": text, "batch": batch,
        "layers": maps.num_layers, "heads": maps.num_heads, "n": n,
        "tokens": list(maps.real_tokens(batch)[:n]),
        "notice": "" if n == n_real else f"showing the first {n} of {n_real} tokens",
        "colours": list(HEAD_COLOURS),
        "segments": sentence_segments(maps.real_tokens(batch)[:n]),
        "weights": base64.b64encode(levels.tobytes()).decode("ascii"),
        "neurons": neuron_data(maps, batch, keep),
    }


def neuron_data(maps: AttentionRecord, batch: int, keep: Any) -> dict[str, object] | None:
    """The neuron view's vectors of the first tokens of one row: queries and keys as
    little-endian float16 ``(layers, heads, tokens, head size)``, base64; None where the
    maps hold no vectors."""
    import numpy as np

    if maps.queries is None or maps.keys is None:
        return None
    layers, heads, size = maps.num_layers, maps.num_heads, int(maps.queries.shape[-1])
    n = min(len(keep), max(1, MAX_EMBEDDED_VECTORS // (2 * layers * heads * size)))
    index = keep[:n]

    def packed(vectors: Any) -> str:
        chosen = vectors[:, batch][:, :, index].numpy()  # (L, nh, n, hd)
        half = np.clip(chosen, -65504, 65504).astype("<f2")
        return base64.b64encode(half.tobytes()).decode("ascii")

    return {"n": n, "size": size, "scales": [float(s) for s in maps.scales],
            "queries": packed(maps.queries), "keys": packed(maps.keys),
            "notice": "" if n == len(keep) else
            f"the neuron view shows the first {n} of {len(keep)} tokens"}


def sentence_segments(tokens: Sequence[str]) -> list[int]:
    """0 for each token of sentence A, 1 for sentence B: B starts after the first separator
    that more tokens follow (``[CLS] a b [SEP] c d [SEP]``: 0 0 0 0 1 1 1)."""
    segments, segment = [], 0
    for i, token in enumerate(tokens):
        segments.append(segment)
        if token in SEPARATORS and i + 1 < len(tokens):
            segment = 1
    return segments


def html_page(maps: AttentionRecord, batch: int = 0) -> str:
    """The page as text: data as JSON (``<`` escaped, so no token can close the script).

    Raises:
        InputError: a batch row out of range.
    """
    data = json.dumps(page_data(maps, batch), ensure_ascii=False, sort_keys=True)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = html.escape(f"attention: {maps.title}")
    # one pass over the template: a title holding "__DATA__" stays text, never the data
    fills = {"__TITLE__": title, "__DATA__": data, "__NEURONS__": NEURON_SCRIPT}
    return re.sub("__TITLE__|__DATA__|__NEURONS__", lambda m: fills[m.group()], _PAGE)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { --fg: #24292f; --bg: #fff; --muted: #57606a; --line: #d0d7de; --panel: #f6f8fa;
  --accent: #0969da; --low: #fff; --high: rgb(8,48,107); color-scheme: light; }
@media (prefers-color-scheme: dark) {
  :root:not([data-theme="light"]) { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1;
    --line: #3d444d; --panel: #151b23; --accent: #4493f8; --low: rgb(13,17,23);
    --high: rgb(121,192,255); color-scheme: dark; }
}
:root[data-theme="dark"] { --fg: #e6edf3; --bg: #0d1117; --muted: #9198a1; --line: #3d444d;
  --panel: #151b23; --accent: #4493f8; --low: rgb(13,17,23); --high: rgb(121,192,255);
  color-scheme: dark; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
  padding: 1em 1.5em; max-width: 1100px; color: var(--fg); background: var(--bg);
  line-height: 1.4; }
h2 { font-size: 1.25em; margin: .2em 0 .4em; overflow-wrap: anywhere; }
p { margin: .4em 0; }
#caption, #notice, .hint, #readout { color: var(--muted); font-size: .9em;
  overflow-wrap: anywhere; }
button, select { font: inherit; font-size: .9em; color: var(--fg); }
.tabs { display: flex; flex-wrap: wrap; gap: .4em; margin: .6em 0; }
.tabs button { border: 1px solid var(--line); background: var(--panel); border-radius: 6px;
  padding: .35em .9em; cursor: pointer; }
.tabs button[aria-pressed="true"] { background: var(--accent); color: #fff;
  border-color: var(--accent); }
.tabs #theme { margin-left: auto; }
.controls { display: flex; flex-wrap: wrap; gap: .4em 1.2em; align-items: center;
  margin: .4em 0; }
.controls[hidden], .heads[hidden], .scale[hidden] { display: none; }
.heads { display: flex; flex-wrap: wrap; gap: .3em; align-items: center; margin: .4em 0; }
.heads button { border: 2px solid; border-radius: 6px; padding: .1em .45em; min-width: 2.7em;
  cursor: pointer; color: #fff; }
.heads button[aria-pressed="false"] { background: var(--bg) !important; color: var(--muted); }
.heads .all { border-color: var(--line); color: var(--fg); background: var(--panel); }
#view, #zoom-view { margin-top: .6em; }
#view svg, #zoom-view svg { max-width: 100%; height: auto; display: block; }
svg text { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px;
  fill: var(--fg); }
svg text.muted { fill: var(--muted); }
svg text.tok { cursor: pointer; }
svg text.tok.on, svg text.qtok { font-weight: bold; fill: var(--accent); }
svg text.ntok { cursor: pointer; }
svg text.dim { fill-opacity: .3; }
svg .off { display: none; }
.scale { display: flex; align-items: center; gap: .5em; font-size: .85em; color: var(--muted); }
.scale .bar { width: 160px; max-width: 40vw; height: 12px; border: 1px solid var(--line);
  background: linear-gradient(to right, var(--low), var(--high)); }
.model { display: grid; gap: 4px; align-items: center; justify-content: start; max-width: 100%; }
.model canvas { width: 100%; max-width: 64px; aspect-ratio: 1 / 1; image-rendering: pixelated;
  border: 1px solid var(--line); cursor: zoom-in; box-sizing: border-box; }
.model .label { font-size: .75em; color: var(--muted); text-align: center; white-space: nowrap; }
#zoom { position: fixed; inset: 0; background: var(--bg); overflow: auto;
  padding: 1em 1.5em; z-index: 1; }
#zoom[hidden] { display: none; }
#zoom header { display: flex; gap: 1em; align-items: center; justify-content: space-between; }
@media (max-width: 640px) { body { padding: .8em .75em; } #zoom { padding: .8em .75em; } }
</style>
</head>
<body>
<h2>__TITLE__</h2>
<p id="caption"></p>
<div class="tabs" role="group" aria-label="view">
<button type="button" data-view="head" aria-pressed="true">head view</button>
<button type="button" data-view="model" aria-pressed="false">model view</button>
<button type="button" data-view="matrix" aria-pressed="false">matrix view</button>
<button type="button" data-view="neuron" aria-pressed="false">neuron view</button>
<button type="button" id="theme" aria-pressed="false" title="dark or light page">dark</button>
</div>
<div class="controls" id="controls">
<label id="layer-box">layer <select id="layer"></select></label>
<label id="head-box">head <select id="head"></select></label>
<label id="query-box">query <select id="query"></select></label>
<label id="sentence-box">sentences <select id="sentence">
<option value="all">all</option><option value="aa">A \u2192 A</option>
<option value="ab">A \u2192 B</option><option value="ba">B \u2192 A</option>
<option value="bb">B \u2192 B</option></select></label>
</div>
<div class="heads" id="heads" role="group" aria-label="heads"></div>
<div class="scale" id="scale"><span>0</span><span class="bar"></span><span>1</span>
<span>attention weight (row: query, column: key)</span></div>
<p class="hint" id="hint"></p>
<p id="notice"></p>
<div id="view"></div>
<p id="readout"></p>
<div id="zoom" hidden role="dialog" aria-label="one head, zoomed">
<header><b id="zoom-title"></b><button type="button" id="zoom-close">close</button></header>
<div id="zoom-view"></div>
</div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
__NEURONS__
const raw = atob(D.weights);
const W = new Uint8Array(raw.length);
for (let i = 0; i < raw.length; i++) W[i] = raw.charCodeAt(i);
const n = D.n, pair = D.segments.indexOf(1) >= 0;
const $ = id => document.getElementById(id);
const state = {view: "head", heads: new Array(D.heads).fill(true), pinned: null};
function weight(l, h, i, j) { return W[((l * D.heads + h) * n + i) * n + j] / 255; }
function colour(h) { return D.colours[h % D.colours.length]; }
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}
// The page is dark when the toggle says so, else when the system prefers it.
const darkQuery = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
function dark() {
  const chosen = document.documentElement.dataset.theme;
  return chosen ? chosen === "dark" : !!(darkQuery && darkQuery.matches);
}
// Weight 0 to 1 from the page's background colour to a deep (light page) or bright
// (dark page) blue: the weights stand out on either.
function ends() {
  return dark() ? [[13, 17, 23], [121, 192, 255]] : [[255, 255, 255], [8, 48, 107]];
}
function rgb(v) {
  const [a, b] = ends();
  return [0, 1, 2].map(c => Math.round(a[c] + (b[c] - a[c]) * v));
}
function fill(v) { return "rgb(" + rgb(v).join(",") + ")"; }
const labelWidth = Math.max(5, ...D.tokens.map(t => t.length)) * 7.2 + 8;
// The sentence filter: "ab" keeps lines from queries in sentence A to keys in sentence B.
function side(want, i) { return want === "all" || D.segments[i] === (want === "a" ? 0 : 1); }
function kept(i, j) {
  const s = pair ? $("sentence").value : "all";
  return s === "all" || (side(s[0], i) && side(s[1], j));
}
function svgOpen(width, height) {
  return '<svg width="' + width + '" height="' + height +
    '" viewBox="0 0 ' + width + " " + height + '">';
}
// Head view: queries left, keys right, one line per (query, key, head), in the head's colour.
function linesSvg(l, heads) {
  const row = 18, gap = 160, left = labelWidth, right = labelWidth + gap, top = 24;
  const s = pair ? $("sentence").value : "all";
  let out = "";
  heads.forEach(h => {
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
      const v = weight(l, h, i, j);
      if (v >= 0.01 && kept(i, j)) out += '<line class="q' + i + " k" + j + '" x1="' + left +
        '" y1="' + (top + (i + 0.5) * row) + '" x2="' + right + '" y2="' +
        (top + (j + 0.5) * row) + '" stroke="' + colour(h) + '" stroke-width="2" stroke-opacity="' +
        v.toFixed(3) + '"/>';
    }
  });
  D.tokens.forEach((t, i) => {
    const y = top + (i + 0.5) * row + 4;
    const dimQ = s !== "all" && !side(s[0], i) ? " dim" : "";
    const dimK = s !== "all" && !side(s[1], i) ? " dim" : "";
    out += '<text class="tok' + dimQ + '" data-side="q" data-i="' + i + '" x="' + (left - 4) +
      '" y="' + y + '" text-anchor="end" tabindex="0" role="button">' + esc(t) + "</text>";
    out += '<text class="tok' + dimK + '" data-side="k" data-i="' + i + '" x="' + (right + 4) +
      '" y="' + y + '" tabindex="0" role="button">' + esc(t) + "</text>";
  });
  out += '<text class="muted" x="' + (left - 4) + '" y="14" text-anchor="end">query</text>';
  out += '<text class="muted" x="' + (right + 4) + '" y="14">key</text>';
  return svgOpen(2 * labelWidth + gap + 8, top + n * row + 8) + out + "</svg>";
}
// Show only the lines of one token (hover, click or tap), or all of them again.
function focus(root, token) {
  root.querySelectorAll("text.tok").forEach(t => t.classList.toggle("on", t === token));
  const cls = token ? token.dataset.side + token.dataset.i : null;
  root.querySelectorAll("line").forEach(line => line.classList.toggle(
    "off", cls !== null && !line.classList.contains(cls)));
}
function wireTokens(root) {
  root.addEventListener("mouseover", e => {
    if (state.pinned === null && e.target.classList.contains("tok")) focus(root, e.target);
  });
  root.addEventListener("mouseout", e => {
    if (state.pinned === null && e.target.classList.contains("tok")) focus(root, null);
  });
  root.addEventListener("click", e => {
    const token = e.target.classList && e.target.classList.contains("tok") ? e.target : null;
    const key = token ? token.dataset.side + token.dataset.i : null;
    state.pinned = key === state.pinned ? null : key;
    focus(root, state.pinned === null ? null : token);
  });
  root.addEventListener("keydown", e => {
    if ((e.key === "Enter" || e.key === " ") && e.target.classList.contains("tok")) {
      e.preventDefault(); e.target.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    }
  });
}
function matrixSvg(l, h) {
  const cell = n <= 16 ? 24 : Math.max(4, Math.min(24, Math.floor(640 / n)));
  const left = labelWidth, top = labelWidth;
  let s = "";
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    const v = weight(l, h, i, j);
    s += '<rect data-i="' + i + '" data-j="' + j + '" x="' + (left + j * cell) + '" y="' +
      (top + i * cell) + '" width="' + cell + '" height="' + cell + '" fill="' + fill(v) +
      '"><title>' + esc(D.tokens[i]) + " \u2192 " + esc(D.tokens[j]) + ": " + v.toFixed(3) +
      "</title></rect>";
  }
  if (cell >= 8) D.tokens.forEach((t, i) => {
    const c = (i + 0.5) * cell + 4;
    s += '<text x="' + (left - 4) + '" y="' + (top + c) + '" text-anchor="end">' + esc(t) +
      "</text>";
    s += '<text transform="rotate(-90 ' + (left + c) + " " + (top - 4) + ')" x="' + (left + c) +
      '" y="' + (top - 4) + '">' + esc(t) + "</text>";
  });
  s += '<rect x="' + left + '" y="' + top + '" width="' + n * cell + '" height="' + n * cell +
    '" fill="none" stroke="var(--line)"/>';
  return svgOpen(left + n * cell + 8, top + n * cell + 8) + s + "</svg>";
}
// Model view: layers x heads thumbnails, one pixel per (query, key); click one to zoom.
function modelGrid() {
  const grid = document.createElement("div");
  grid.className = "model";
  grid.style.gridTemplateColumns = "auto repeat(" + D.heads + ", minmax(0, 64px))";
  const label = text => {
    const e = document.createElement("span"); e.className = "label"; e.textContent = text;
    grid.appendChild(e);
  };
  label("");
  for (let h = 0; h < D.heads; h++) label("h" + h);
  for (let l = 0; l < D.layers; l++) {
    label("layer " + l);
    for (let h = 0; h < D.heads; h++) {
      const canvas = document.createElement("canvas");
      canvas.width = canvas.height = n;
      canvas.tabIndex = 0;
      canvas.dataset.layer = l; canvas.dataset.head = h;
      canvas.title = "layer " + l + ", head " + h + ": click to zoom";
      canvas.setAttribute("role", "button");
      const context = canvas.getContext("2d");
      if (context) {
        const image = context.createImageData(n, n);
        for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
          const c = rgb(weight(l, h, i, j)), k = 4 * (i * n + j);
          image.data[k] = c[0]; image.data[k + 1] = c[1]; image.data[k + 2] = c[2];
          image.data[k + 3] = 255;
        }
        context.putImageData(image, 0, 0);
      }
      grid.appendChild(canvas);
    }
  }
  grid.addEventListener("click", e => {
    if (e.target.tagName === "CANVAS") zoom(+e.target.dataset.layer, +e.target.dataset.head);
  });
  grid.addEventListener("keydown", e => {
    if ((e.key === "Enter" || e.key === " ") && e.target.tagName === "CANVAS") {
      e.preventDefault(); zoom(+e.target.dataset.layer, +e.target.dataset.head);
    }
  });
  return grid;
}
function zoom(l, h) {
  $("zoom-title").textContent = "layer " + l + " \u00b7 head " + h;
  $("zoom-view").innerHTML = linesSvg(l, [h]);
  $("zoom").hidden = false;
  $("zoom-close").focus();
}
function unzoom() { $("zoom").hidden = true; $("zoom-view").innerHTML = ""; }
function headButtons() {
  const box = $("heads");
  box.innerHTML = "";
  const add = (text, cls, title, onClick) => {
    const b = document.createElement("button");
    b.type = "button"; b.textContent = text; b.className = cls; b.title = title;
    b.addEventListener("click", onClick); box.appendChild(b); return b;
  };
  add("all", "all", "show every head", () => { state.heads.fill(true); draw(); });
  add("none", "all", "hide every head", () => { state.heads.fill(false); draw(); });
  for (let h = 0; h < D.heads; h++) {
    const b = add("h" + h, "head", "head " + h + ": click to toggle, double-click for it alone",
      () => { state.heads[h] = !state.heads[h]; draw(); });
    b.style.borderColor = colour(h); b.style.background = colour(h);
    b.addEventListener("dblclick", () => {
      state.heads.fill(false); state.heads[h] = true; draw();
    });
  }
}
function draw() {
  const view = $("view"), l = +$("layer").value, h = +$("head").value;
  document.querySelectorAll(".tabs button").forEach(b => b.setAttribute(
    "aria-pressed", String(b.dataset.view === state.view)));
  $("layer-box").hidden = state.view === "model";
  $("head-box").hidden = state.view !== "matrix" && state.view !== "neuron";
  $("query-box").hidden = state.view !== "neuron";
  $("theme").textContent = dark() ? "light" : "dark";
  $("theme").setAttribute("aria-pressed", String(dark()));
  $("sentence-box").hidden = !pair || state.view !== "head";
  $("controls").hidden = state.view === "model";
  $("heads").hidden = state.view !== "head";
  $("scale").hidden = state.view !== "matrix" && state.view !== "model";
  $("readout").textContent = "";
  document.querySelectorAll("#heads button.head").forEach((b, k) => b.setAttribute(
    "aria-pressed", String(state.heads[k])));
  state.pinned = null;
  if (state.view === "head") {
    const heads = state.heads.map((on, k) => on ? k : -1).filter(k => k >= 0);
    view.innerHTML = linesSvg(l, heads);
    $("hint").textContent = "Every head overlaid, one colour each: toggle heads above " +
      "(double-click: that head alone). Hover, click or tap a token to see only its lines.";
  } else if (state.view === "neuron") {
    view.innerHTML = neuronView(l, h, +$("query").value);
    $("hint").textContent = NEURONS ? "One head, one query token: its query vector q, " +
      "each key vector k, their elementwise product q \u00d7 k (blue positive, orange " +
      "negative), the score q\u00b7k \u00d7 scale and the attention weight. Tap a key's " +
      "token to make it the query." : "";
  } else if (state.view === "matrix") {
    view.innerHTML = matrixSvg(l, h);
    $("hint").textContent = "Rows: query, columns: key. Tap or hover a cell to read it.";
  } else {
    view.innerHTML = "";
    view.appendChild(modelGrid());
    $("hint").textContent = "Rows: layers, columns: heads. Click or tap a head to zoom on it.";
  }
}
function options(id, count) {
  const select = $(id);
  for (let i = 0; i < count; i++) select.add(new Option(String(i), String(i)));
  select.addEventListener("change", draw);
}
options("layer", D.layers);
options("head", D.heads);
D.tokens.forEach((t, i) => $("query").add(new Option(i + ": " + t, String(i))));
$("query").addEventListener("change", draw);
$("theme").addEventListener("click", () => {
  document.documentElement.dataset.theme = dark() ? "light" : "dark"; draw();
});
if (darkQuery && darkQuery.addEventListener) darkQuery.addEventListener("change", draw);
$("sentence").addEventListener("change", draw);
document.querySelectorAll(".tabs button").forEach(b => b.addEventListener("click", () => {
  state.view = b.dataset.view; unzoom(); draw();
}));
wireTokens($("view"));
wireTokens($("zoom-view"));
$("view").addEventListener("click", e => {
  const i = e.target.dataset ? e.target.dataset.i : undefined, j = e.target.dataset ?
    e.target.dataset.j : undefined;
  if (state.view === "matrix" && i !== undefined && j !== undefined) {
    $("readout").textContent = D.tokens[+i] + " \u2192 " + D.tokens[+j] + ": " +
      weight(+$("layer").value, +$("head").value, +i, +j).toFixed(3);
  }
});
$("view").addEventListener("mouseover", e => {
  if (state.view === "matrix" && e.target.dataset && e.target.dataset.j !== undefined) {
    e.target.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  }
});
$("zoom-close").addEventListener("click", unzoom);
$("zoom").addEventListener("click", e => { if (e.target === $("zoom")) unzoom(); });
document.addEventListener("keydown", e => { if (e.key === "Escape") unzoom(); });
headButtons();
$("caption").textContent = "batch row " + D.batch + (D.text ? ": " + D.text : "") +
  (pair ? " (a text pair: sentence A, then B)" : "");
$("notice").textContent = D.notice;
const opening = location.hash.slice(1);  // page.html#model opens the model view
if (["head", "model", "matrix", "neuron"].indexOf(opening) >= 0) state.view = opening;
draw();
</script>
</body>
</html>
"""
