"""What ``introspect diff`` prints: the verdict, the layer table and the nodes over budget.

``--quiet`` keeps the verdict and, on failure, the first divergence and its hints (as
``pytest -q`` keeps the failures); the tables are for a person at a terminal.
"""

from __future__ import annotations

from typing import Any, TextIO

from introspect.cli.tables import Column, console_for, emit, table

MAX_FAILING_ROWS = 20  # without --nodes; the rest is "… and N more"


def verdict_lines(result: Any) -> list[str]:
    """The verdict, the first divergence and its hints: what even --quiet prints."""
    return [line for line in result.summary().splitlines() if not line.startswith("note: ")]


def print_diff(result: Any, stream: TextIO, *, quiet: bool, all_nodes: bool,
               out: str | None = None, width: int | None = None) -> None:
    """Print the diff for a person on ``stream`` (stdout, or stderr when a report holds it)."""
    console = console_for(stream, width)
    lines = verdict_lines(result) if quiet else result.summary().splitlines()
    for line in lines:  # long lines wrap as the terminal wraps them: no hard breaks
        console.print(line, style=_verdict_style(line), soft_wrap=True)
    if quiet:
        return
    console.print()
    emit(console, layer_table(result, console.width))
    rows = shown_rows(result, all_nodes)
    if rows:
        console.print()
        emit(console, node_table(result, console.width, rows,
                                 None if all_nodes else MAX_FAILING_ROWS))
    if out:
        console.print(f"reports written to {out}", soft_wrap=True)


def layer_table(result: Any, width: int) -> Any:
    """One row per layer: status, errors, node counts and the worst node."""
    columns = [Column("status", 6), Column("layer", 0, flex=2, min_width=15),
               Column("output err", 10, justify="right"), Column("worst local", 11,
                                                                justify="right"),
               Column("nodes", 5, justify="right"), Column("fail", 4, justify="right"),
               Column("worst node", 0, flex=5, min_width=12, cut="start")]
    rows = [("pass" if r.passed else "FAIL", r.layer, _num(r.max_abs_err),
             _num(r.local_max_abs_err), str(r.nodes), str(r.failing), r.worst_node)
            for r in result.layer_rows]
    return table(columns, rows, width=min(width, 140), title="layers")


def shown_rows(result: Any, all_nodes: bool) -> list[Any]:
    """Nodes over budget; with ``--nodes`` every compared pair."""
    from introspect.diff.records import STATUS_DRIFT, STATUS_FAIL

    if all_nodes:
        return [r for r in result.rows if r.local_max_abs_err is not None
                or r.status in (STATUS_FAIL, STATUS_DRIFT)]
    return [r for r in result.rows if r.status == STATUS_FAIL]


WIDE = 130  # from this width on, the node table shows the budget and the candidate's node


def node_table(result: Any, width: int, rows: list[Any], limit: int | None) -> Any:
    """Nodes with their errors first, then where they are (cut to fit, never wrapped)."""
    from introspect.diff.records import STATUS_FAIL

    wide = width >= WIDE
    columns = [Column("status", 6), Column("local err", 9, justify="right"),
               Column("output err", 10, justify="right"),
               *([Column("budget", 8, justify="right")] if wide else []),
               Column("layer", 0, flex=2, min_width=15), Column("op", 0, flex=2, min_width=8),
               Column("reference node", 0, flex=5, cut="start"),
               *([Column("candidate node", 0, flex=4, cut="start")] if wide else [])]
    shown = rows if limit is None else rows[:limit]
    cells = [("FAIL" if r.status == STATUS_FAIL else r.status, _num(r.local_max_abs_err),
              _num(r.max_abs_err), *([_num(r.atol)] if wide else []), r.layer, r.op,
              r.reference_node, *([r.candidate_node] if wide else []))
             for r in shown]
    failing = sum(r.status == STATUS_FAIL for r in rows)
    title = (f"{len(rows)} compared nodes ({failing} over budget)" if limit is None
             else f"{failing} node(s) over budget")
    hint = "(--nodes lists every node; --out writes nodes.csv)" if limit is not None else ""
    return table(columns, cells, width=width, title=title, more=len(rows) - len(shown),
                 more_hint=hint)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _verdict_style(line: str) -> str:
    if line.startswith("  hint:"):
        return "yellow"
    if "parity FAILS" in line or line.startswith("first divergence"):
        return "bold red"
    return "bold green" if "parity holds" in line else ""
