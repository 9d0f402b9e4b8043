"""What ``introspect diff`` prints: the verdict, the layer table and the nodes over budget.

``--quiet`` keeps the verdict and, on failure, the first divergence and its hints (as
``pytest -q`` keeps the failures); the tables are for a person at a terminal.

A failing diff ends, as pytest does, on where to look: its last line is the first
divergence (also under ``--quiet``); the hints at its cause come under the verdict, each
once. The tables share one set of status words (pass, FAIL, drift, n/a) and a legend.
"""

from __future__ import annotations

from typing import Any, TextIO

from introspect.cli.tables import Column, console_for, emit, table

MAX_FAILING_ROWS = 20  # without --nodes; the rest is "… and N more"


def verdict_lines(result: Any) -> list[str]:
    """The verdict and the hints at the failure's cause: what opens the output."""
    summary = result.summary().splitlines()
    lines = summary[:1]
    if getattr(result, "step_rows", None):  # --generate: the first divergent step
        from introspect.diff.generation.tables import step_summary

        lines += step_summary(result)
    d = result.first_divergence
    if d is not None:
        if getattr(d, "detail", ""):
            lines.append(f"  detail: {d.detail}")
        lines += [f"  hint: {h}" for h in dict.fromkeys(d.hints)]
    backward = getattr(result, "backward", None)
    if backward is not None:  # --backward: its verdict, first divergence and hints
        lines += [line for line in backward.summary().splitlines()
                  if not line.startswith("note: ")]
    return lines


def _notes(result: Any) -> list[str]:
    backward = getattr(result, "backward", None)
    return [*result.notes, *(backward.notes if backward is not None else ())]


def divergence_line(result: Any) -> str | None:
    """The first divergence in one line (the last line of a failing diff), or None."""
    d = result.first_divergence
    backward = getattr(result, "backward", None)
    if d is None and backward is not None and backward.first_divergence is not None:
        first = [line for line in backward.summary().splitlines()
                 if line.startswith("first backward divergence")]
        return first[0] if first else None
    if d is None:
        return None
    return (f"first divergence: {d.reference_node} -> {d.candidate_node} "
            f"({d.op} in {d.module or d.layer}), local max abs error "
            f"{d.local_max_abs_err:.3g} over budget {d.budget}")


def print_diff(result: Any, stream: TextIO, *, quiet: bool, all_nodes: bool,
               out: str | None = None, width: int | None = None,
               heads: Any = None) -> None:
    """Print the diff for a person on ``stream`` (stdout, or stderr when a report holds it).

    ``heads``: the head-by-head parity (``HeadParity``) to report, or None.
    """
    from introspect.diff.status import layer_statuses, status_legend, status_word

    console = console_for(stream, width)
    lines = verdict_lines(result)
    if not quiet:
        lines += [f"note: {n}" for n in _notes(result)]
    for line in lines:  # long lines wrap as the terminal wraps them: no hard breaks
        console.print(line, style=_verdict_style(line), soft_wrap=True)
    if not quiet:
        console.print()
        emit(console, layer_table(result, console.width))
        rows = shown_rows(result, all_nodes)
        words = [*layer_statuses(result), *(status_word(r.status) for r in rows)]
        if rows:
            console.print()
            emit(console, node_table(result, console.width, rows,
                                     None if all_nodes else MAX_FAILING_ROWS))
        console.print(status_legend(words), style="dim")  # wrapped at the width
    if getattr(result, "step_rows", None):
        from introspect.cli.generation_view import print_steps

        print_steps(result, stream, quiet=quiet, width=width)
    backward = getattr(result, "backward", None)
    if backward is not None and not quiet:  # --backward: the weights' gradients
        console.print()
        console.print(backward.parameter_table(limit=10 if backward.passed else 20),
                      markup=False, highlight=False, soft_wrap=True)
    if heads is not None and (not quiet or not heads.all_passed):
        console.print(heads.summary(), soft_wrap=True)
    if out and not quiet:
        console.print(f"reports written to {out}", soft_wrap=True)
    last = divergence_line(result)
    if last:
        console.print(last, style=_verdict_style(last), soft_wrap=True)


def layer_table(result: Any, width: int) -> Any:
    """One row per layer: status, errors, node counts and the worst node."""
    columns = [Column("status", 6), Column("layer", 0, flex=2, min_width=15),
               Column("output err", 10, justify="right"), Column("worst local", 11,
                                                                justify="right"),
               Column("nodes", 5, justify="right"), Column("fail", 4, justify="right"),
               Column("worst node", 0, flex=5, min_width=12, cut="start")]
    from introspect.diff.status import layer_statuses

    rows = [(word, r.layer, _num(r.max_abs_err) if r.nodes else "",
             _num(r.local_max_abs_err) if r.nodes else "", str(r.nodes), str(r.failing),
             r.worst_node)
            for r, word in zip(result.layer_rows, layer_statuses(result), strict=True)]
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
    from introspect.diff.status import status_word

    wide = width >= WIDE
    columns = [Column("status", 6), Column("local err", 9, justify="right"),
               Column("output err", 10, justify="right"),
               *([Column("budget", 8, justify="right")] if wide else []),
               Column("layer", 0, flex=2, min_width=15), Column("op", 0, flex=2, min_width=8),
               Column("reference node", 0, flex=5, cut="start"),
               *([Column("candidate node", 0, flex=4, cut="start")] if wide else [])]
    shown = rows if limit is None else rows[:limit]
    cells = [(status_word(r.status), _num(r.local_max_abs_err),
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
