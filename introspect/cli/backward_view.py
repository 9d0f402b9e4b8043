"""What ``introspect diff --backward`` adds to the terminal: the gradients' tables.

The same status words as the forward's tables (pass, FAIL, drift, n/a), the headers the
columns of ``result.backward.nodes`` and ``result.parameters`` (docs/columns.md). Rows
over budget come first; a capped table ends with "… and N more".
"""

from __future__ import annotations

from typing import Any

from introspect.cli.tables import Column, emit, prose, table

MAX_PARAMETER_ROWS = 10  # without --nodes; failing and drifting weights first
MAX_NODE_ROWS = 10
WIDE = 130  # from this width on, the parameter table shows the candidate's names


def print_backward(backward: Any, console: Any, *, all_rows: bool = False) -> None:
    """The node gradients over budget (if any) and the weights' gradients."""
    rows = [r for r in backward.rows if r.status in ("fail", "drift")]
    if rows:
        console.print()
        emit(console, node_gradient_table(rows, console.width,
                                          None if all_rows else MAX_NODE_ROWS))
    console.print()
    if not backward.parameter_rows:  # (a table of no rows is all title, wrapped narrow)
        prose(console, "parameters: no weight's gradient compared (the candidate holds no "
                       "parameter paired with the reference's: its weights frozen, or "
                       "buffers)")
        return
    emit(console, parameter_table(backward.parameter_rows, console.width,
                                  None if all_rows else MAX_PARAMETER_ROWS))


def node_gradient_table(rows: list[Any], width: int, limit: int | None) -> Any:
    """Node gradients over budget, nearest the loss first (where a backward bug shows first)."""
    from introspect.diff.status import status_word

    ordered = sorted(rows, key=lambda r: (r.status != "fail", -r.reference_index))
    shown = ordered if limit is None else ordered[:limit]
    columns = [Column("status", 0), Column("local_max_abs_err", 10, justify="right"),
               Column("max_abs_err", 9, justify="right"),
               Column("layer", 0, flex=2, min_width=15),
               Column("op", 0, flex=2, min_width=8, optional=True),
               Column("reference_node", 0, flex=5, cut="start")]
    cells = [(status_word(r.status), _num(r.local_max_abs_err), _num(r.max_abs_err), r.layer,
              r.op, r.reference_node) for r in shown]
    failing = sum(r.status == "fail" for r in rows)
    return table(columns, cells, width=width,
                 title=f"node gradients over budget ({failing} FAIL, {len(rows) - failing} "
                       "drift)", more=len(ordered) - len(shown),
                 more_hint="(--nodes lists them all; --out writes diff.json)")


def parameter_table(rows: list[Any], width: int, limit: int | None) -> Any:
    """One row per weight: its gradient's error; failing, then drifting, weights first."""
    from introspect.diff.status import status_word

    rank = {"fail": 0, "drift": 1}
    ordered = sorted(rows, key=lambda r: rank.get(r.status, 2)) if limit is not None else rows
    shown = ordered if limit is None else ordered[:limit]
    wide = width >= WIDE and any(r.candidate != r.reference for r in shown)
    columns = [Column("status", 0), Column("max_abs_err", 9, justify="right"),
               Column("max_rel_err", 9, justify="right"),
               Column("reference", 0, flex=5, min_width=12, cut="start"),
               *([Column("candidate", 0, flex=4, min_width=12, cut="start")] if wide else [])]
    cells = [(status_word(r.status), _num(r.max_abs_err), _num(r.max_rel_err), r.reference,
              *([r.candidate] if wide else [])) for r in shown]
    failing = sum(r.status == "fail" for r in rows)
    drifting = sum(r.status == "drift" for r in rows)
    return table(columns, cells, width=width,
                 title=f"parameters: {len(rows)} weights' gradients ({failing} FAIL, "
                       f"{drifting} drift)", more=len(ordered) - len(shown),
                 more_hint="(--nodes lists them all; --out writes diff.json)")


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


__all__ = ["parameter_table", "print_backward"]
