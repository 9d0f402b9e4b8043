"""The gradient-parity sections of every report (``diff(..., backward=True)``).

Each writer of ``introspect.report`` adds one small section from here when the result
holds a backward comparison: the verdict and loss, the first backward divergence with its
hints, and the parameter table (failing rows first).
"""

from __future__ import annotations

import html
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from introspect.report.html_tables import number_cell, table, text_cell

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

_MAX_ROWS = 40  # parameter rows shown in Markdown (all in JSON and HTML)


def backward_dict(result: DiffResult) -> dict[str, Any] | None:
    """The JSON report's ``backward`` entry (None without a backward comparison)."""
    b = result.backward
    if b is None:
        return None
    d = b.first_divergence
    return {"passed": b.passed, "loss": b.loss, "reference_loss": b.reference_loss,
            "candidate_loss": b.candidate_loss, "sgd_lr": _lr(),
            "sgd_max_abs_err": b.sgd_max_abs_err,
            "first_divergence": None if d is None else {**asdict(d), "hints": list(d.hints)},
            "nodes": [asdict(r) for r in b.rows],
            "parameters": [asdict(r) for r in b.parameter_rows], "notes": list(b.notes)}


def backward_markdown(result: DiffResult) -> list[str]:
    b = result.backward
    if b is None:
        return []
    verdict = "✅ gradient parity holds" if b.passed else "❌ gradient parity fails"
    lines = ["", f"### Backward: {verdict}", "",
             f"{b.loss} loss: reference {b.reference_loss:.6g}, candidate "
             f"{b.candidate_loss:.6g}; {len(b.rows)} node gradients, {len(b.parameter_rows)} "
             f"parameters; one SGD step (lr {_lr():g}): max abs error {b.sgd_max_abs_err:.3g}."]
    d = b.first_divergence
    if d is not None:
        where = f"parameter `{d.parameter}`" if d.parameter else \
            f"`{d.reference_node}` ({_md(d.op)} in `{d.module or d.layer}`)"
        lines += ["", f"**First backward divergence:** {where}, max abs error "
                      f"{d.local_max_abs_err:.3g} over budget {_md(d.budget)}."]
        lines += [f"- hint: {_md(h)}" for h in d.hints]
    rows = sorted(b.parameter_rows, key=lambda r: r.status != "fail")
    lines += ["", f"<details><summary>Parameters ({sum(r.status == 'fail' for r in rows)} "
                  "failing)</summary>", "",
              "| reference | candidate | relation | max abs err | max rel err | status |",
              "|---|---|---|---:|---:|---|"]
    for r in rows[:_MAX_ROWS]:
        lines.append(f"| `{r.reference}` | `{r.candidate}` | {r.relation} | {_num(r.max_abs_err)}"
                     f" | {_num(r.max_rel_err)} | {'**FAIL**' if r.status == 'fail' else r.status}"
                     " |")
    if len(rows) > _MAX_ROWS:
        lines.append(f"| ... {len(rows) - _MAX_ROWS} more | | | | | |")
    lines += ["", "</details>"]
    lines += [f"> {_md(n)}" for n in b.notes]
    return lines


def backward_html(result: DiffResult) -> list[str]:
    b = result.backward
    if b is None:
        return []
    e = html.escape
    verdict = "gradient parity holds" if b.passed else "gradient parity fails"
    parts = [f"<h2>Backward: {e(verdict)}</h2>",
             f"<p>{e(b.loss)} loss: reference {b.reference_loss:.6g}, candidate "
             f"{b.candidate_loss:.6g}; one SGD step (lr {_lr():g}): max abs error "
             f"{b.sgd_max_abs_err:.3g}</p>"]
    d = b.first_divergence
    if d is not None:
        where = f"parameter <code>{e(d.parameter)}</code>" if d.parameter else \
            f"<code>{e(d.reference_node)}</code> ({e(d.op)} in {e(d.module or d.layer)})"
        parts.append(f"<p>First backward divergence: {where}, max abs error "
                     f"{d.local_max_abs_err:.3g} over budget {e(d.budget)}</p>")
        parts += [f"<p>&rarr; {e(h)}</p>" for h in d.hints]
    headers = ["reference", "candidate", "relation", "max abs err", "max rel err", "status",
               "hint"]
    rows = [("fail" if r.status == "fail" else "",
             [text_cell(r.reference, code=True), text_cell(r.candidate, code=True),
              text_cell(r.relation), number_cell(r.max_abs_err), number_cell(r.max_rel_err),
              text_cell(r.status), text_cell(r.hint)])
            for r in sorted(b.parameter_rows, key=lambda r: r.status != "fail")]
    parts.append(table("parameters", headers, rows))
    return parts


def _lr() -> float:
    from introspect.diff.backward import SGD_LR

    return SGD_LR


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


__all__ = ["backward_dict", "backward_html", "backward_markdown"]
