"""The attention page's neuron view, as bertviz draws it (seed 003 of this project uses it).

For one layer, head and query token: the query vector q, each key vector k, their
elementwise product q × k, the score q·k × scale, and the attention weight the model
computed. Vectors are cells coloured blue (positive) or orange (negative), their
strength relative to the largest magnitude of their column (q and k share one). Hover or
tap a cell to read its value; tap a key's token to make it the query.

The vectors come as little-endian float16 in the page's data (``page.neuron_data``); the
script decodes them, computes the products and scores, and reads the weights from the
same bytes as the other views. It is part of ``page``'s single script.
"""

from __future__ import annotations

NEURON_SCRIPT = r"""
// float16 (IEEE 754 half) to a number.
function half(bits) {
  const sign = bits & 0x8000 ? -1 : 1, e = (bits >> 10) & 31, f = bits & 1023;
  if (e === 0) return sign * f * Math.pow(2, -24);
  if (e === 31) return f ? NaN : sign * Infinity;
  return sign * (1 + f / 1024) * Math.pow(2, e - 15);
}
function halves(text) {
  const raw = atob(text), out = new Float32Array(raw.length / 2);
  for (let i = 0; i < out.length; i++) {
    out[i] = half(raw.charCodeAt(2 * i) | (raw.charCodeAt(2 * i + 1) << 8));
  }
  return out;
}
const NEURONS = D.neurons ? {n: D.neurons.n, size: D.neurons.size, scales: D.neurons.scales,
  notice: D.neurons.notice, q: halves(D.neurons.queries), k: halves(D.neurons.keys)} : null;
// The vector of token t of head h in layer l (queries or keys).
function vector(values, l, h, t) {
  const size = NEURONS.size, at = ((l * D.heads + h) * NEURONS.n + t) * size;
  return values.subarray(at, at + size);
}
// Blue for positive, orange for negative, opaque at the column's largest magnitude.
function signed(v, most) {
  const a = most > 0 ? Math.min(1, Math.abs(v) / most) : 0;
  return (v >= 0 ? "rgba(33,102,172," : "rgba(230,97,1,") + a.toFixed(3) + ")";
}
function cells(values, x, y, width, height, most) {
  let out = "";
  values.forEach((v, d) => {
    out += '<rect class="cell" x="' + (x + d * width) + '" y="' + y + '" width="' + width +
      '" height="' + height + '" fill="' + signed(v, most) + '"><title>' + d + ": " +
      v.toPrecision(3) + "</title></rect>";
  });
  return out + '<rect x="' + x + '" y="' + y + '" width="' + values.length * width +
    '" height="' + height + '" fill="none" stroke="var(--line)"/>';
}
function neuronView(l, h, i) {
  if (!NEURONS) {
    return "<p class='hint'>No neuron view: this model's graph shows no plain q\u00b7k\u1d40 " +
      "before its softmax, so its query and key vectors could not be read.</p>";
  }
  const m = NEURONS.n, size = NEURONS.size;
  if (i >= m) i = m - 1;
  // Cells as wide as the view allows (2 to 6 px): on a phone the text stays readable.
  const room = ($("view").clientWidth || 640) - (labelWidth + 8 + 32 + 64 + 100);
  const width = Math.max(2, Math.min(6, Math.floor(room / (2 * size))));
  const block = size * width, row = 18, cellHeight = 12, top = 58;
  const x0 = labelWidth + 8, x1 = x0 + block + 16, x2 = x1 + block + 16, x3 = x2 + 64;
  const q = vector(NEURONS.q, l, h, i), scale = NEURONS.scales[l];
  const keys = [], products = [];
  let mostVector = Math.max(...q.map(Math.abs)), mostProduct = 0;
  for (let j = 0; j < m; j++) {
    const k = vector(NEURONS.k, l, h, j), p = k.map((v, d) => v * q[d]);
    keys.push(k); products.push(p);
    mostVector = Math.max(mostVector, ...k.map(Math.abs));
    mostProduct = Math.max(mostProduct, ...p.map(Math.abs));
  }
  let out = '<text class="muted" x="' + (x0 - 6) + '" y="14" text-anchor="end">query</text>';
  out += '<text class="qtok" x="' + (x0 - 6) + '" y="32" text-anchor="end">' +
    esc(D.tokens[i]) + "</text>" + cells(q, x0, 22, width, cellHeight, mostVector);
  out += '<text class="muted" x="' + (x0 + block + 6) + '" y="32">q</text>';
  const headings = [[x0 - 6, "key", "end"], [x0, "k", "start"], [x1, "q \u00d7 k", "start"],
    [x2 + 56, "q\u00b7k \u00d7 " + scale.toPrecision(3), "end"], [x3, "weight", "start"]];
  headings.forEach(([x, text, anchor]) => {
    out += '<text class="muted" x="' + x + '" y="' + (top - 6) + '" text-anchor="' + anchor +
      '">' + esc(text) + "</text>";
  });
  for (let j = 0; j < m; j++) {
    const y = top + j * row, score = scale * products[j].reduce((a, b) => a + b, 0);
    const w = weight(l, h, i, j);
    out += '<text class="ntok" data-j="' + j + '" x="' + (x0 - 6) + '" y="' + (y + 10) +
      '" text-anchor="end" role="button" tabindex="0">' + esc(D.tokens[j]) + "</text>";
    out += cells(keys[j], x0, y, width, cellHeight, mostVector);
    out += cells(products[j], x1, y, width, cellHeight, mostProduct);
    out += '<text class="score" x="' + (x2 + 56) + '" y="' + (y + 10) +
      '" text-anchor="end">' + score.toFixed(2) + "</text>";
    out += '<rect class="weight" x="' + x3 + '" y="' + y + '" width="' + (60 * w).toFixed(1) +
      '" height="' + cellHeight + '" fill="var(--accent)"/>';
    out += '<text x="' + (x3 + 64) + '" y="' + (y + 10) + '">' + w.toFixed(2) + "</text>";
  }
  const note = NEURONS.notice ? '<p class="hint">' + esc(NEURONS.notice) + "</p>" : "";
  return note + svgOpen(x3 + 100, top + m * row + 8) + out + "</svg>";
}
document.addEventListener("click", e => {
  const t = e.target;
  if (t.classList && t.classList.contains("ntok")) { $("query").value = t.dataset.j; draw(); }
});
document.addEventListener("keydown", e => {
  const t = e.target;
  if ((e.key === "Enter" || e.key === " ") && t.classList && t.classList.contains("ntok")) {
    e.preventDefault(); $("query").value = t.dataset.j; draw();
  }
});
"""

__all__ = ["NEURON_SCRIPT"]
