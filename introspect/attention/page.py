"""A self-contained HTML page to browse attention: pick layer, head and view.

Everything is inline (data, style, script): no CDN, no network, it opens from a file or a
CI artifact. The weights of one batch row are embedded as bytes (weight × 255, base64),
so a page of a 12 × 12 model over 128 tokens stays near 3 MB; longer rows are cut to
``page_max_tokens`` and the page says so.
"""

from __future__ import annotations

import base64
import html
import json
import math
from typing import TYPE_CHECKING

from introspect.attention.svg import HEAD_COLOURS

if TYPE_CHECKING:
    from introspect.attention.maps import AttentionMaps

MAX_EMBEDDED_WEIGHTS = 4_000_000  # layers × heads × n × n bytes, before base64


def page_max_tokens(layers: int, heads: int) -> int:
    """The most tokens whose weights of every layer and head fit the page budget."""
    return max(8, math.isqrt(MAX_EMBEDDED_WEIGHTS // max(layers * heads, 1)))


def page_data(maps: AttentionMaps, batch: int = 0) -> dict[str, object]:
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
        "weights": base64.b64encode(levels.tobytes()).decode("ascii"),
    }


def html_page(maps: AttentionMaps, batch: int = 0) -> str:
    """The page as text: data as JSON (``<`` escaped, so no token can close the script).

    Raises:
        InputError: a batch row out of range.
    """
    data = json.dumps(page_data(maps, batch), ensure_ascii=False, sort_keys=True)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = html.escape(f"attention: {maps.title}")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", data)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #24292f; }
label { margin-right: 1em; }
#notice, #caption { color: #57606a; font-size: 0.9em; }
#view { margin-top: 1em; }
#view text { font-family: monospace; font-size: 12px; }
#view .hidden { display: none; }
</style>
</head>
<body>
<h2>__TITLE__</h2>
<p id="caption"></p>
<div>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<label>view <select id="kind"><option value="head">head (lines)</option>
<option value="matrix">matrix (heatmap)</option></select></label>
</div>
<p id="notice"></p>
<div id="view"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const raw = atob(D.weights);
const W = new Uint8Array(raw.length);
for (let i = 0; i < raw.length; i++) W[i] = raw.charCodeAt(i);
const n = D.n;
function weight(l, h, i, j) { return W[((l * D.heads + h) * n + i) * n + j] / 255; }
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}
function fill(v) {
  const mix = (a, b) => Math.round(a + (b - a) * v);
  return "rgb(" + mix(255, 8) + "," + mix(255, 48) + "," + mix(255, 107) + ")";
}
const labelWidth = Math.max(...D.tokens.map(t => t.length)) * 7.2 + 8;
function headView(l, h) {
  const row = 18, gap = 160, left = labelWidth, right = labelWidth + gap;
  const colour = D.colours[h % D.colours.length];
  let s = "";
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    const v = weight(l, h, i, j);
    if (v >= 0.01) s += '<line class="q' + i + '" x1="' + left + '" y1="' + (20 + (i + 0.5) * row) +
      '" x2="' + right + '" y2="' + (20 + (j + 0.5) * row) + '" stroke="' + colour +
      '" stroke-width="2" stroke-opacity="' + v.toFixed(3) + '"/>';
  }
  D.tokens.forEach((t, i) => {
    const y = 20 + (i + 0.5) * row + 4;
    s += '<text class="tok" data-i="' + i + '" x="' + (left - 4) + '" y="' + y +
      '" text-anchor="end">' + esc(t) + "</text>";
    s += '<text x="' + (right + 4) + '" y="' + y + '">' + esc(t) + "</text>";
  });
  s += '<text x="' + (left - 4) + '" y="12" text-anchor="end" fill="#57606a">query</text>';
  s += '<text x="' + (right + 4) + '" y="12" fill="#57606a">key</text>';
  return '<svg width="' + (2 * labelWidth + gap + 20) + '" height="' + (40 + n * row) + '">' +
    s + "</svg>";
}
function matrixView(l, h) {
  const cell = n <= 16 ? 24 : Math.max(4, Math.min(24, Math.floor(640 / n)));
  const left = labelWidth, top = labelWidth;
  let s = "";
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    const v = weight(l, h, i, j);
    s += '<rect x="' + (left + j * cell) + '" y="' + (top + i * cell) + '" width="' + cell +
      '" height="' + cell + '" fill="' + fill(v) + '"><title>' + esc(D.tokens[i]) + " \\u2192 " +
      esc(D.tokens[j]) + ": " + v.toFixed(3) + "</title></rect>";
  }
  if (cell >= 8) D.tokens.forEach((t, i) => {
    const c = (i + 0.5) * cell + 4;
    s += '<text x="' + (left - 4) + '" y="' + (top + c) + '" text-anchor="end">' + esc(t) +
      "</text>";
    s += '<text transform="rotate(-90 ' + (left + c) + " " + (top - 4) + ')" x="' + (left + c) +
      '" y="' + (top - 4) + '">' + esc(t) + "</text>";
  });
  return '<svg width="' + (left + n * cell + 20) + '" height="' + (top + n * cell + 20) + '">' +
    s + "</svg>";
}
function draw() {
  const l = +document.getElementById("layer").value, h = +document.getElementById("head").value;
  const kind = document.getElementById("kind").value;
  const view = document.getElementById("view");
  view.innerHTML = kind === "head" ? headView(l, h) : matrixView(l, h);
  view.querySelectorAll("text.tok").forEach(t => {
    t.addEventListener("mouseenter", () => view.querySelectorAll("line").forEach(
      line => line.classList.toggle("hidden", !line.classList.contains("q" + t.dataset.i))));
    t.addEventListener("mouseleave", () => view.querySelectorAll("line").forEach(
      line => line.classList.remove("hidden")));
  });
}
function options(id, count, prefix) {
  const select = document.getElementById(id);
  for (let i = 0; i < count; i++) select.add(new Option(prefix + i, i));
  select.addEventListener("change", draw);
}
options("layer", D.layers, "");
options("head", D.heads, "");
document.getElementById("kind").addEventListener("change", draw);
document.getElementById("caption").textContent = "batch row " + D.batch +
  (D.text ? ": " + D.text : "") + " \\u2014 hover a query token (left) to see only its lines";
document.getElementById("notice").textContent = D.notice;
draw();
</script>
</body>
</html>
"""
