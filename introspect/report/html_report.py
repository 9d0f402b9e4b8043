"""``diff.html``: one self-contained page a person reads in a browser.

It leads with what matters: the verdict, the first divergence and its hints, and the
layer table; then every compared node, error columns first, in a table that sorts on a
click and filters as you type (a few lines of inline script: no CDN, no network); then
the nodes without counterpart; and the drawing, coloured by error, which zooms, pans,
finds nodes by name and opens a panel per node (``html_drawing``). Every text from a
model or a user (labels, folder names, node names) is escaped.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING
from urllib.parse import quote

from introspect.diff.records import STATUS_FAIL, STATUS_SKIPPED, STATUS_UNMATCHED, error_words
from introspect.diff.status import WORD_NA, layer_statuses, status_legend, status_word
from introspect.report.generation import generation_html
from introspect.report.html_drawing import DRAWING_CSS, DRAWING_SCRIPT, drawing_section
from introspect.report.html_tables import Cell, na_cell, number_cell, table, text_cell
from introspect.report.overlay import drawn_members, failing_layer_names
from introspect.version import __version__

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
  padding: 1.5em 2em; max-width: 1400px; color: #1f2328; line-height: 1.45; }
h1 { font-size: 1.5em; margin: 0 0 .3em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
.verdict { padding: .8em 1.1em; border-radius: 6px; border: 1px solid; margin-bottom: 1em; }
.verdict.pass { background: #dafbe1; border-color: #4ac26b; }
.verdict.fail { background: #ffebe9; border-color: #ff8182; }
.verdict .word { font-weight: 700; } .pass .word { color: #1a7f37; } .fail .word { color: #cf222e; }
.divergence { border-left: 4px solid #cf222e; padding: .2em 1em; margin: 1em 0; }
.hint { background: #fff8c5; border-left: 4px solid #d4a72c; padding: .4em 1em; margin: .5em 0; }
.notes { color: #59636e; font-size: .9em; }
code { background: #f6f8fa; padding: 0 3px; border-radius: 3px; font-size: .92em; }
.table-wrap { max-width: 100%; overflow-x: auto; }
table.introspect-diff { border-collapse: collapse; font-size: .85em; }
table.introspect-diff th, table.introspect-diff td { border: 1px solid #d0d7de;
  padding: 2px 8px; text-align: left; white-space: nowrap; }
table.introspect-diff td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.introspect-diff th { background: #f6f8fa; position: sticky; top: 0; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[data-dir=asc]::after { content: " \\25B2"; }
table.sortable th[data-dir=desc]::after { content: " \\25BC"; }
tr.fail td { background-color:#f8d7da; } tr.drift td { background-color:#fff3cd; }
tr.unmatched td, tr.skipped td { color: #777; }
.filter { margin: .5em 0; display: flex; gap: 1.5em; align-items: center; }
.filter input[type=search] { width: 24em; padding: 3px 6px; }
"""
# Readable on a phone (390 px): long node names wrap instead of widening the page, the
# filter row wraps, tables scroll inside their own box, the drawing zooms in its own.
_CSS_SMALL_SCREENS = """
h1, p, .verdict, .divergence, .hint, code, summary { overflow-wrap: anywhere; }
.filter { flex-wrap: wrap; gap: .4em 1.5em; }
.filter input[type=search] { max-width: 100%; box-sizing: border-box; }
nav.jump { font-size: .9em; margin: 0 0 1em; } nav.jump a { margin-right: 1em; }
.verdict a, .divergence a { color: inherit; font-weight: 600; }
@media (max-width: 640px) {
  body { padding: 1em .75em; } h1 { font-size: 1.25em; }
  .filter input[type=search] { width: 100%; }
}
"""

# Click a header to sort (numbers by value, the rest as text); type to filter rows.
_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var dir = th.dataset.dir === "asc" ? "desc" : "asc";
      table.querySelectorAll("th").forEach(function (other) { delete other.dataset.dir; });
      th.dataset.dir = dir;
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[column], y = b.cells[column];
        var p = x.dataset.v, q = y.dataset.v, order;
        if (p !== undefined && q !== undefined) {
          p = p === "" ? -Infinity : parseFloat(p); q = q === "" ? -Infinity : parseFloat(q);
          order = p < q ? -1 : p > q ? 1 : 0;
        } else { order = x.textContent.localeCompare(y.textContent); }
        return dir === "asc" ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
function introspectFilter(id) {
  var text = document.getElementById(id + "-text").value.toLowerCase();
  var failing = document.getElementById(id + "-failing").checked;
  document.getElementById(id).tBodies[0].querySelectorAll("tr").forEach(function (row) {
    var show = row.textContent.toLowerCase().indexOf(text) >= 0 &&
      (!failing || row.className === "fail");
    row.style.display = show ? "" : "none";
  });
}
"""


def html_report(result: DiffResult, *, svg: bytes | None = None) -> str:
    """The whole report as one HTML page (inline CSS, script and SVG)."""
    e = html.escape
    title = f"introspect diff: {result.candidate_label} vs {result.reference_label}"
    outlined = _outlined(result, svg)  # failing layers with a red outline to link to
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{e(title)}</title>",
        f"<style>{_CSS}{_CSS_SMALL_SCREENS}{DRAWING_CSS}</style></head><body>",
        *_verdict(result, outlined=outlined),
        _jump_links(drawn=svg is not None),
        *_divergence(result, drawn=_drawn_names(result, svg)),
        *generation_html(result),
        "<h2 id='layers-section'>Layers</h2>",
        _layers_table(result, outlined=outlined),
        *_drawing_section(result, svg),
        *_nodes_section(result),
        *_unmatched_section(result),
        *_backward_section(result),
        f"<p class='notes'>introspect {e(__version__)}</p>",
        f"<script>{_SCRIPT}{DRAWING_SCRIPT if svg is not None else ''}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _backward_section(result: DiffResult) -> list[str]:
    from introspect.report.backward_report import backward_html

    return backward_html(result)


def _drawing_section(result: DiffResult, svg: bytes | None) -> list[str]:
    """The drawing, right under the layers table: the failing layer is one glance away."""
    if svg is None:
        return []
    return drawing_section(result, svg, drawn_members(result))


def _jump_links(*, drawn: bool) -> str:
    links = [("layers-section", "layers"), ("drawing", "drawing"),
             ("nodes-section", "compared nodes"), ("unmatched-nodes", "nodes without counterpart")]
    return "<nav class='jump'>Jump to: " + "".join(
        f"<a href='#{anchor}'>{text}</a>" for anchor, text in links
        if drawn or anchor != "drawing") + "</nav>"


def _layer_anchor(layer: str) -> str:
    """The id of a failing layer's outline in the drawing (``render.dot`` writes it)."""
    return f"outline_{layer}"


def _outlined(result: DiffResult, svg: bytes | None) -> set[str]:
    """The failing layers the drawing outlines (a link needs its target: the mask is no
    block of its own, and without Graphviz there is no drawing)."""
    text = svg.decode("utf-8") if svg is not None else ""
    return {layer for layer in failing_layer_names(result)
            if f'id="{html.escape(_layer_anchor(layer))}"' in text}


def _verdict(result: DiffResult, *, outlined: set[str] | None = None) -> list[str]:
    e = html.escape
    kind, word = ("pass", "Parity holds") if result.passed else ("fail", "Parity fails")
    counts = result.counts()
    failing, outlined = failing_layer_names(result), outlined or set()
    where = ""
    if failing:
        links = ", ".join(
            f"<a href='#{e(_layer_anchor(layer)) if layer in outlined else 'layers'}'>"
            f"{e(layer)}</a>" for layer in failing)
        where = f" Failing: {links}" + (" (outlined in the drawing)." if outlined else ".")
    return [
        f"<h1>introspect diff: <b>{e(result.candidate_label)}</b> against "
        f"<b>{e(result.reference_label)}</b></h1>",
        f"<div class='verdict {kind}'><span class='word'>{word}</span>: "
        f"{counts[STATUS_FAIL]} node(s) over budget; max abs error "
        f"{result.max_abs_err:.3g}; {counts['pairs']} aligned pairs, "
        f"{e(_coverage(result))}.{where}</div>",
    ]


def _coverage(result: DiffResult) -> str:
    return getattr(result.alignment, "coverage_text", None) or \
        f"{result.alignment.coverage:.0%} of the reference's tensor nodes aligned"


def _drawn_names(result: DiffResult, svg: bytes | None) -> set[str]:
    """The reference nodes the drawing shows (as themselves or in a box)."""
    if svg is None:
        return set()
    titles = {html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg.decode())}
    return titles | {m for members in drawn_members(result).values() for m in members}


def _divergence(result: DiffResult, *, drawn: set[str] | None = None) -> list[str]:
    e = html.escape
    d = result.first_divergence
    parts = []
    if d is not None:
        where = f"<code>{e(d.reference_node)}</code>"
        if d.reference_node in (drawn or set()):  # opens the node's panel in the drawing
            where = f"<a href='#node={e(quote(d.reference_node))}'>{where}</a>"
        parts.append(f"<div class='divergence'><p><b>First divergence:</b> "
                     f"{where} &rarr; <code>{e(d.candidate_node)}"
                     f"</code> ({e(d.op)} in <code>{e(d.module or d.layer)}</code>), "
                     f"{error_words(d)} {d.local_max_abs_err:.3g} over budget "
                     f"{e(d.budget)}.</p></div>")
        parts += [f"<p class='hint'><b>Hint:</b> {e(h)}</p>" for h in d.hints]
    parts += [f"<p class='notes'>Note: {e(n)}</p>" for n in result.notes]
    return parts


def _layers_table(result: DiffResult, *, outlined: set[str] | None = None) -> str:
    headers = ["status", "layer", "max abs err", "local max abs err", "worst node",
               "nodes", "failing", "unmatched"]
    outlined = outlined or set()
    rows = []
    words = layer_statuses(result)
    for r, word in zip(result.layer_rows, words, strict=True):
        layer = text_cell(r.layer)
        if r.layer in outlined:  # a link to its outline in the drawing
            layer = Cell(f"<a href='#{html.escape(_layer_anchor(r.layer))}'>{layer.html}</a>")
        compared = word != WORD_NA  # nothing compared: no error, never an error of 0
        cells: list[Cell] = [text_cell(word), layer,
                             number_cell(r.max_abs_err) if compared else na_cell(),
                             number_cell(r.local_max_abs_err) if compared else na_cell(),
                             text_cell(r.worst_node, code=True), number_cell(r.nodes),
                             number_cell(r.failing), number_cell(r.unmatched)]
        rows.append(({"FAIL": "fail", "drift": "drift"}.get(word, ""), cells))
    return (table("layers", headers, rows)
            + f"<p class='legend'>{html.escape(status_legend(words))}</p>")


_NODE_HEADERS = ["status", "local max abs err", "max abs err", "atol", "rtol", "#", "layer",
                 "op", "reference node", "candidate node", "shape", "dtype", "matched by",
                 "note"]


def _nodes_section(result: DiffResult) -> list[str]:
    compared = [r for r in result.rows if r.status not in (STATUS_UNMATCHED, STATUS_SKIPPED)]
    rows = []
    for r in compared:
        cells: list[Cell] = [
            text_cell(status_word(r.status)), number_cell(r.local_max_abs_err),
            number_cell(r.max_abs_err),
            number_cell(r.atol), number_cell(r.rtol), number_cell(r.reference_index),
            text_cell(r.layer), text_cell(r.op), text_cell(r.reference_node, code=True),
            text_cell(r.candidate_node, code=True), text_cell(r.shape), text_cell(r.dtype),
            text_cell(r.matched_by), text_cell(r.note)]
        rows.append((r.status, cells))
    failing = sum(r.status == STATUS_FAIL for r in compared)
    return [
        f"<h2 id='nodes-section'>Compared nodes ({len(compared)}, {failing} over budget)</h2>",
        "<p class='notes'>Local error: the candidate's node fed the reference's inputs (where "
        "the bug is). Max abs error: each model on its own (where it shows). Click a header "
        "to sort.</p>",
        "<div class='filter'><label>Filter <input type='search' id='nodes-text' "
        "placeholder='node, op, layer...' oninput=\"introspectFilter('nodes')\"></label>"
        "<label><input type='checkbox' id='nodes-failing' onchange=\"introspectFilter('nodes')\""
        f"{' checked' if failing else ''}> only over budget</label></div>",
        table("nodes", _NODE_HEADERS, rows, hide_unless=STATUS_FAIL if failing else None),
    ]


def _unmatched_section(result: DiffResult) -> list[str]:
    unmatched = [r for r in result.rows if r.status == STATUS_UNMATCHED]
    rows = [(r.status, [text_cell("reference" if r.reference_node else "candidate"),
                        text_cell(r.reference_node or r.candidate_node, code=True),
                        text_cell(r.layer), text_cell(r.op), text_cell(r.shape),
                        text_cell(r.note)]) for r in unmatched]
    skipped = sum(r.status == STATUS_SKIPPED for r in result.rows)
    return [f"<details id='unmatched-nodes'><summary><b>Nodes without counterpart "
            f"({len(unmatched)})</b>: never paired by position; each says why</summary>",
            table("unmatched", ["graph", "node", "layer", "op", "shape", "reason"], rows),
            "</details>",
            f"<p class='notes'>{skipped} shape-bookkeeping and constant nodes were not "
            "compared.</p>"]
