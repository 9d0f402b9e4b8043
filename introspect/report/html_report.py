"""A self-contained HTML report: inline CSS and SVG, no script, no network."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from introspect import __version__
from introspect.diff.records import STATUS_SKIPPED, STATUS_UNMATCHED

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #1f2328; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.pass { color: #1a7f37; } .fail { color: #cf222e; }
table.introspect-diff { border-collapse: collapse; font-size: 0.85em; }
table.introspect-diff th, table.introspect-diff td { border: 1px solid #d0d7de;
  padding: 2px 6px; text-align: left; white-space: nowrap; }
table.introspect-diff th { background: #f6f8fa; position: sticky; top: 0; }
code { background: #f6f8fa; padding: 0 3px; }
.drawing { overflow: auto; max-height: 90vh; border: 1px solid #d0d7de; }
"""


def html_report(result: DiffResult, *, svg: bytes | None = None) -> str:
    """The whole report as one HTML page."""
    from introspect.diff.result import html_table

    verdict = ("<span class='pass'>parity holds</span>" if result.passed
               else "<span class='fail'>parity fails</span>")
    e = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>introspect diff: {e(result.candidate_label)} vs "
        f"{e(result.reference_label)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>introspect diff: {verdict}</h1>",
        f"<p><b>{e(result.candidate_label)}</b> against <b>{e(result.reference_label)}</b>: "
        f"{len(result.alignment.pairs)} aligned pairs, {result.alignment.coverage:.0%} of the "
        f"reference's tensor nodes aligned, max abs error {result.max_abs_err:.3g}.</p>",
    ]
    d = result.first_divergence
    if d is not None:
        parts.append(f"<p><b>First divergence:</b> <code>{e(d.reference_node)}</code> "
                     f"&rarr; <code>{e(d.candidate_node)}</code> ({e(d.op)} in "
                     f"<code>{e(d.module or d.layer)}</code>), local max abs error "
                     f"{d.local_max_abs_err:.3g} over budget {e(d.budget)}.</p>")
        parts += [f"<p>&rarr; {e(h)}</p>" for h in d.hints]
    parts += [f"<p><i>{e(n)}</i></p>" for n in result.notes]
    parts += ["<h2>Layers</h2>", html_table(result.layers, status_column="passed")]
    nodes = result.nodes
    compared = nodes[nodes["status"] != STATUS_UNMATCHED]
    unmatched = nodes[nodes["status"] == STATUS_UNMATCHED]
    parts += ["<h2>Aligned nodes</h2>", html_table(compared)]
    parts += [f"<h2>Nodes without counterpart ({len(unmatched)})</h2>",
              html_table(unmatched[["reference_node", "candidate_node", "module", "layer",
                                    "op", "shape", "note"]])]
    skipped = sum(r.status == STATUS_SKIPPED for r in result.rows)
    parts.append(f"<p>{skipped} shape-bookkeeping and constant nodes were not compared.</p>")
    if svg is not None:
        text = svg.decode("utf-8")
        text = text[text.find("<svg"):] if "<svg" in text else text
        parts += ["<h2>Drawing</h2>", f"<div class='drawing'>{text}</div>"]
    parts.append(f"<p><small>introspect {e(__version__)}</small></p></body></html>")
    return "\n".join(parts) + "\n"
