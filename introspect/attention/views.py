"""Static SVG pictures of attention, written as plain text: byte-stable, labels escaped.

Three views of ``AttentionMaps`` (bertviz's, drawn once, no JavaScript):

- ``head``: one panel per (layer, head): the tokens twice, queries on the left, keys on
  the right, a line from each query to each key, as opaque as its weight;
- ``matrix``: one heatmap per (layer, head), query rows × key columns, token labels, the
  weights written in the cells when they fit;
- ``model``: the whole model at a glance, a layers × heads grid of small heatmaps.

Only real tokens are drawn (padding never). Long inputs stay readable: the head and matrix
views show a window of tokens (the first ``HEAD_VIEW_MAX_TOKENS`` / ``MATRIX_MAX_TOKENS``
unless ``window`` says which) and say so on the picture; the model view averages blocks
of tokens down to at most ``THUMBNAIL_MAX_CELLS`` per side.

The SVG text itself (stable numbers, escaping, colours) is written by ``svg``, so the same
maps give the same bytes.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from introspect.attention.svg import (
    HEAD_COLOURS,
    HIGH,
    MUTED,
    Svg,
    blue,
    diverging,
    label,
    mix,
    num,
    text_width,
)
from introspect.errors import InputError

if TYPE_CHECKING:
    import numpy

    from introspect.attention.records import AttentionRecord
    from introspect.diff.tolerance import Budget

VIEWS = ("head", "matrix", "model")
HEAD_VIEW_MAX_TOKENS = 64
MATRIX_MAX_TOKENS = 128
THUMBNAIL_MAX_CELLS = 64
MIN_LINE_WEIGHT = 0.01  # lighter lines are invisible anyway; leaving them out keeps files small


@dataclass(frozen=True)
class Panel:
    """One drawing of one head on one batch row: weights over a window of real tokens."""

    title: str
    weights: list[list[float]]  # (query, key) over the window
    tokens: tuple[str, ...]
    colour: str


# ----------------------------------------------------------------------------------------
# Choosing what to draw


def window_of(n: int, window: tuple[int, int] | None, limit: int) -> tuple[int, int, str]:
    """(start, end, notice) of the real tokens to draw; the notice is empty when all fit.

    Raises:
        InputError: a window outside the tokens or empty.
    """
    if window is None:
        if n <= limit:
            return 0, n, ""
        return 0, limit, (f"showing tokens 0 to {limit - 1} of {n}; "
                          "pick others with --tokens START:END")
    start, end = window
    end = min(end, n)
    if not 0 <= start < end:
        raise InputError(f"token window {window[0]}:{window[1]} is empty or outside the "
                         f"{n} real tokens of this row")
    if end - start > limit:
        end = start + limit
        return start, end, f"showing tokens {start} to {end - 1} of {n} (at most {limit})"
    notice = "" if (start, end) == (0, n) else f"showing tokens {start} to {end - 1} of {n}"
    return start, end, notice


def panels(maps: AttentionRecord, layers: Sequence[int], heads: Sequence[int], batch: int,
           start: int, end: int) -> list[Panel]:
    """One panel per (layer, head), over real tokens ``start:end`` of row ``batch``."""
    tokens = maps.real_tokens(batch)[start:end]
    result = []
    for layer in layers:
        for head in heads:
            weights = maps.head(layer, head, batch)[start:end, start:end]
            result.append(Panel(f"layer {layer} · head {head}", weights.tolist(), tokens,
                                HEAD_COLOURS[head % len(HEAD_COLOURS)]))
    return result


MAX_CAPTION_CHARS = 80


def _caption(maps: AttentionRecord, batch: int) -> str:
    """Model and row, with the row's text shortened: a 512-token text is no title."""
    text = maps.texts[batch] if batch < len(maps.texts) else ""
    if len(text) > MAX_CAPTION_CHARS:
        text = text[: MAX_CAPTION_CHARS - 1] + "…"
    row = f"batch row {batch}" + (f": {text}" if text else "")
    return f"{maps.title} · {row}" if maps.title else row


# ----------------------------------------------------------------------------------------
# Head view: tokens on both sides, one line per (query, key)

_ROW = 18.0
_FONT_SIZE = 12.0
_GAP = 140.0  # between the two token columns, where the lines run


def _head_panel(svg: Svg, panel: Panel, x0: float, y0: float) -> tuple[float, float]:
    labels = [label(t) for t in panel.tokens]
    width = max((text_width(t, _FONT_SIZE) for t in labels), default=0.0) + 8
    svg.text(x0 + width + _GAP / 2, y0 + 14, panel.title, size=13, anchor="middle", bold=True)
    top = y0 + 30
    svg.text(x0 + width - 4, top, "query", size=10, anchor="end", fill=MUTED)
    svg.text(x0 + width + _GAP + 4, top, "key", size=10, fill=MUTED)
    top += 8
    left, right = x0 + width, x0 + width + _GAP
    lines = []
    for i, row in enumerate(panel.weights):
        for j, w in enumerate(row):
            if w >= MIN_LINE_WEIGHT:
                lines.append(f'<line x1="{num(left)}" y1="{num(top + (i + 0.5) * _ROW)}" '
                             f'x2="{num(right)}" y2="{num(top + (j + 0.5) * _ROW)}" '
                             f'stroke-opacity="{w:.3f}"/>')
    svg.add(f'<g stroke="{panel.colour}" stroke-width="2">' + "".join(lines) + "</g>")
    for i, t in enumerate(labels):
        y = top + (i + 0.5) * _ROW + _FONT_SIZE * 0.35
        svg.text(left - 4, y, t, size=_FONT_SIZE, anchor="end")
        svg.text(right + 4, y, t, size=_FONT_SIZE)
    return 2 * width + _GAP + 24, top - y0 + len(labels) * _ROW + 12


# ----------------------------------------------------------------------------------------
# Matrix view: a heatmap with token labels


def _cell_size(n: int) -> float:
    return 24.0 if n <= 16 else max(4.0, min(24.0, math.floor(480 / n)))


def _matrix_panel(svg: Svg, panel: Panel, x0: float, y0: float,
                  fill: str = "weight", scale: float = 1.0) -> tuple[float, float]:
    n = len(panel.tokens)
    cell = _cell_size(n)
    size = min(11.0, max(cell * 0.75, 4.0))
    every = max(1, math.ceil(8 / cell))  # label every token only where labels fit
    labels = [label(t) for t in panel.tokens]
    width = max((text_width(t, size) for t in labels), default=0.0) + 6
    svg.text(x0 + width + n * cell / 2, y0 + 14, panel.title, size=13, anchor="middle",
             bold=True)
    top, left = y0 + 22 + width, x0 + width
    for j, t in enumerate(labels):
        if j % every == 0:
            svg.text(left + (j + 0.5) * cell + size * 0.35, top - 4, t, size=size, rotate=True)
    for i, t in enumerate(labels):
        if i % every == 0:
            svg.text(left - 4, top + (i + 0.5) * cell + size * 0.35, t, size=size, anchor="end")
    values_fit = cell >= 24 and fill == "weight"  # differences: colour and tooltip only
    tooltips = n <= 32
    for i, row in enumerate(panel.weights):
        for j, w in enumerate(row):
            colour = blue(w / scale) if fill == "weight" else diverging(w, scale)
            x, y = left + j * cell, top + i * cell
            if colour != "#ffffff":
                tip = f"{labels[i]} → {labels[j]}: {w:.4f}" if tooltips else ""
                svg.rect(x, y, cell, cell, colour, tip)
            if values_fit:
                strong = abs(w) / scale > 0.55 if scale > 0 else False
                svg.text(x + cell / 2, y + cell / 2 + 2.5, _short(w), size=7, anchor="middle",
                         fill="#ffffff" if strong else MUTED)
    svg.add(f'<rect x="{num(left)}" y="{num(top)}" width="{num(n * cell)}" '
            f'height="{num(n * cell)}" fill="none" stroke="#d0d7de"/>')
    return width + n * cell + 24, top - y0 + n * cell + 16


def _short(w: float) -> str:
    """A weight in three characters where possible: .42, 1.0, -.03."""
    if abs(w) >= 0.995:
        return f"{w:.1f}"
    text = f"{w:.2f}".replace("0.", ".", 1)
    return "0" if text in (".00", "-.00") else text


# ----------------------------------------------------------------------------------------
# Model view: layers × heads of small heatmaps

_THUMB = 56.0


def thumbnail_pixels(weights: torch.Tensor, cells: int = THUMBNAIL_MAX_CELLS) -> torch.Tensor:
    """Average blocks of queries and sum blocks of keys down to at most ``cells`` per side.

    Summing over keys keeps each row a distribution (mass is not diluted by the block).
    """
    n = weights.shape[-1]
    if n <= cells:
        return weights
    block = math.ceil(n / cells)
    pad = block * math.ceil(n / block) - n
    w = torch.nn.functional.pad(weights, (0, pad, 0, pad))
    m = w.shape[-1] // block
    w = w.reshape(m, block, m, block)
    counts = torch.ones(n).float()
    counts = torch.nn.functional.pad(counts, (0, pad)).reshape(m, block).sum(1)  # real rows
    return w.sum(dim=(1, 3)) / counts[:, None]


def _thumbnail_png(weights: torch.Tensor) -> bytes:
    """The heatmap as PNG, each cell a square of pixels: rasterisers smooth scaled images."""
    import numpy as np

    from introspect.attention.raster import png_rgb

    factor = math.ceil(2 * _THUMB / weights.shape[-1])  # at least 2 pixels per cell
    levels = np.rint(np.clip(weights.numpy(), 0.0, 1.0) * 255).astype(np.intp)
    levels = levels.repeat(factor, axis=0).repeat(factor, axis=1)
    return png_rgb(_blue_levels()[levels])


@functools.cache
def _blue_levels() -> numpy.ndarray:
    """The 256 colours of ``blue()`` as a (256, 3) uint8 lookup table."""
    import numpy as np

    return np.array([mix(HIGH, level / 255) for level in range(256)], dtype=np.uint8)


def model_svg(maps: AttentionRecord, layers: Sequence[int], heads: Sequence[int],
              batch: int) -> str:
    """The model view: one small heatmap per (layer, head), rows layers, columns heads."""
    n = maps.length(batch)
    keep = maps.keep[batch].nonzero().flatten()
    svg = Svg()
    left, top = 70.0, 64.0
    svg.text(12, 20, f"model view · {_caption(maps, batch)}", size=13, bold=True)
    cells = min(n, THUMBNAIL_MAX_CELLS)
    notice = f"{n} tokens, one pixel per (query, key)" if n <= THUMBNAIL_MAX_CELLS else \
        f"{n} tokens averaged in blocks to {cells} per side"
    svg.text(12, 38, f"rows: layers, columns: heads; {notice}; darker = more attention",
             size=10, fill=MUTED)
    step = _THUMB + 8
    for column, head in enumerate(heads):
        svg.text(left + column * step + _THUMB / 2, top - 6, f"h{head}", size=10,
                 anchor="middle", fill=MUTED)
    for row, layer in enumerate(layers):
        y = top + row * step
        svg.text(left - 8, y + _THUMB / 2 + 3, f"layer {layer}", size=10, anchor="end",
                 fill=MUTED)
        probs = maps.probs[layer, batch][:, keep][:, :, keep]  # (nh, n, n)
        for column, head in enumerate(heads):
            x = left + column * step
            png = base64.b64encode(_thumbnail_png(thumbnail_pixels(probs[head]))).decode()
            svg.add(f'<g><title>layer {layer}, head {head}</title><image x="{num(x)}" '
                    f'y="{num(y)}" width="{num(_THUMB)}" height="{num(_THUMB)}" '
                    f'preserveAspectRatio="none" style="image-rendering:pixelated" '
                    f'href="data:image/png;base64,{png}"/></g>')
            svg.add(f'<rect x="{num(x)}" y="{num(y)}" width="{num(_THUMB)}" '
                    f'height="{num(_THUMB)}" fill="none" stroke="#d0d7de"/>')
    width = max(left + len(heads) * step + 12, 420.0)
    height = top + len(layers) * step + 12
    return svg.document(width, height, f"attention, model view: {maps.title}")


# ----------------------------------------------------------------------------------------
# Putting panels on a page


def _grid(svg: Svg, items: list[Panel], draw: str, y0: float,
          fill: str = "weight", scales: Sequence[float] | None = None,
          columns: int = 4) -> tuple[float, float]:
    """Lay panels out left to right, ``columns`` per row; return the width and height used."""
    x, y, row_height, width = 12.0, y0, 0.0, 0.0
    for index, panel in enumerate(items):
        if index and index % columns == 0:
            x, y, row_height = 12.0, y + row_height, 0.0
        if draw == "head":
            w, h = _head_panel(svg, panel, x, y)
        else:
            scale = scales[index] if scales else 1.0
            w, h = _matrix_panel(svg, panel, x, y, fill if index == 2 and scales else "weight",
                                 scale)
        x += w
        width, row_height = max(width, x), max(row_height, h)
    return width, y + row_height


def _legend(svg: Svg, x: float, y: float) -> None:
    svg.text(x, y + 9, "0", size=9, anchor="end", fill=MUTED)
    for k in range(11):
        svg.rect(x + 4 + k * 9, y, 9, 10, blue(k / 10))
    svg.text(x + 4 + 11 * 9 + 4, y + 9, "1", size=9, fill=MUTED)


def render_view(maps: AttentionRecord, view: str = "head", *, layers: Sequence[int] | None = None,
                heads: Sequence[int] | None = None, batch: int = 0,
                window: tuple[int, int] | None = None) -> str:
    """An SVG picture of ``maps`` in one of ``VIEWS``.

    Args:
        maps: the attention maps.
        view: ``head``, ``matrix`` or ``model``.
        layers, heads: which to draw (default: layer 0, head 0 for the head and matrix
            views; every layer and head for the model view).
        batch: the batch row to draw.
        window: (start, end) of the real tokens to draw in the head and matrix views.

    Returns:
        The SVG document as text.

    Raises:
        InputError: an unknown view, or a layer, head, row or window out of range.
    """
    if view not in VIEWS:
        raise InputError(f"unknown attention view {view!r}; choose one of {', '.join(VIEWS)}")
    every = view == "model"
    layers = list(range(maps.num_layers)) if layers is None and every else list(layers or [0])
    heads = list(range(maps.num_heads)) if heads is None and every else list(heads or [0])
    maps.check(layers=layers, heads=heads, batch=batch)
    if view == "model":
        return model_svg(maps, layers, heads, batch)
    limit = HEAD_VIEW_MAX_TOKENS if view == "head" else MATRIX_MAX_TOKENS
    start, end, notice = window_of(maps.length(batch), window, limit)
    svg = Svg()
    svg.text(12, 20, f"{view} view · {_caption(maps, batch)}", size=13, bold=True)
    explain = ("line opacity = attention weight (query → key)" if view == "head"
               else "rows: query, columns: key; darker = more attention")
    svg.text(12, 38, explain + (f"; {notice}" if notice else ""), size=10, fill=MUTED)
    if view == "matrix":
        _legend(svg, 12 + text_width(explain, 10) + 24, 29)  # left of the notice, if any
    items = panels(maps, layers, heads, batch, start, end)
    width, height = _grid(svg, items, view, 52.0)
    title = f"attention, {view} view: {maps.title}"
    return svg.document(max(width, 420.0), height + 8, title)


def parity_svg(ref: AttentionRecord, cand: AttentionRecord, budget: Budget, layer: int,
               head: int, batch: int) -> str:
    """Reference, candidate and their difference for one head, side by side."""
    start, end, notice = window_of(ref.length(batch), None, MATRIX_MAX_TOKENS)
    a = ref.head(layer, head, batch)[start:end, start:end]
    b = cand.head(layer, head, batch)[start:end, start:end]
    difference = b - a
    largest = float(difference.abs().max())
    tokens = ref.real_tokens(batch)[start:end]
    items = [Panel("reference", a.tolist(), tokens, HEAD_COLOURS[0]),
             Panel("candidate", b.tolist(), tokens, HEAD_COLOURS[0]),
             Panel(f"candidate − reference (±{largest:.3g})", difference.tolist(), tokens,
                   HEAD_COLOURS[0])]
    svg = Svg()
    svg.text(12, 20, f"layer {layer} · head {head} · batch row {batch}: max abs error "
                     f"{largest:.3g} (budget {budget})", size=13, bold=True)
    svg.text(12, 38, "rows: query, columns: key; difference: blue = candidate higher, "
                     "red = lower" + (f"; {notice}" if notice else ""), size=10, fill=MUTED)
    width, height = _grid(svg, items, "matrix", 52.0, fill="difference",
                          scales=[1.0, 1.0, largest or 1.0], columns=3)
    return svg.document(max(width, 420.0), height + 8,
                        f"attention parity, layer {layer}, head {head}")
