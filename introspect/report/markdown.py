"""A Markdown summary short enough for a pull-request comment.

Verdict, first divergence with its hints, one row per layer, and (folded) the nodes over
budget. Numbers are printed with three significant digits so that the text is stable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from introspect.diff.records import STATUS_FAIL, error_words
from introspect.report.generation import generation_markdown

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

_MAX_FAILING_ROWS = 15


def markdown_summary(result: DiffResult) -> str:
    """The summary as GitHub-flavoured Markdown."""
    verdict = "✅ parity holds" if result.passed else "❌ parity fails"
    a = result.alignment
    lines = [
        f"## introspect diff: {verdict}",
        "",
        f"**{_md(result.candidate_label)}** against **{_md(result.reference_label)}**: "
        f"{len(a.pairs)} aligned pairs, "
        f"{_md(_coverage(a))}, max abs error {_num(result.max_abs_err)}.",
    ]
    d = result.first_divergence
    if d is not None:
        lines += ["", f"**First divergence:** `{d.reference_node}` ({_md(d.op)} in "
                      f"`{d.module or d.layer}`), {error_words(d)} "
                      f"{_num(d.local_max_abs_err)} over budget {d.budget}."]
        lines += [f"- hint: {_md(h)}" for h in dict.fromkeys(d.hints)]
    lines += ["", "| layer | max abs err | local max abs err | worst node | nodes | status |",
              "|---|---:|---:|---|---:|---|"]
    from introspect.diff.status import WORD_NA, layer_statuses, status_legend

    words = layer_statuses(result)
    for r, word in zip(result.layer_rows, words, strict=True):
        status = f"**FAIL** ({r.failing})" if word == "FAIL" else word
        errors = (f"{_num(r.max_abs_err)} | {_num(r.local_max_abs_err)}" if word != WORD_NA
                  else f"{WORD_NA} | {WORD_NA}")  # nothing compared: no error, not an error of 0
        lines.append(f"| {r.layer} | {errors} | {_code(r.worst_node)} | {r.nodes} | {status} |")
    lines += ["", f"<sub>{_md(status_legend(words))}</sub>"]
    failing = [n for n in result.rows if n.status == STATUS_FAIL]
    if failing:
        lines += ["", f"<details><summary>{len(failing)} node(s) over budget</summary>", "",
                  "| reference node | candidate node | op | shape | local max abs err | "
                  "max abs err |", "|---|---|---|---|---:|---:|"]
        for n in failing[:_MAX_FAILING_ROWS]:
            lines.append(f"| {_code(n.reference_node)} | {_code(n.candidate_node)} | {_md(n.op)} | "
                         f"{n.shape} | {_num(n.local_max_abs_err)} | {_num(n.max_abs_err)} |")
        if len(failing) > _MAX_FAILING_ROWS:
            lines.append(f"| ... {len(failing) - _MAX_FAILING_ROWS} more | | | | | |")
        lines += ["", "</details>"]
    lines += generation_markdown(result)
    if result.notes:
        lines += [""] + [f"> {_md(n)}" for n in result.notes]
    if result.backward is not None:
        from introspect.report.backward_report import backward_markdown

        lines += backward_markdown(result)
    return "\n".join(lines) + "\n"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _coverage(alignment: Any) -> str:
    """A dump diff's coverage both ways, or the share of reference nodes aligned."""
    return getattr(alignment, "coverage_text", None) or \
        f"{alignment.coverage:.0%} of the reference's tensor nodes aligned"


def _code(text: str) -> str:
    """A name as inline code in a table cell: no ``|``, backtick or line break can end it."""
    if not text:
        return ""
    safe = text.replace("\r", "\\r").replace("\n", "\\n").replace("|", "\\|")
    fence = "``" if "`" in safe else "`"
    return f"{fence} {safe} {fence}" if fence == "``" else f"`{safe}`"


def _md(text: str) -> str:
    """Text safe in Markdown: no table break, and no HTML (GitHub renders inline HTML)."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|"))
