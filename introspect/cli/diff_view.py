"""What ``introspect diff`` prints: the verdict, the layer table and the nodes over budget.

``--quiet`` keeps the verdict and, on failure, the first divergence and its hints (as
``pytest -q`` keeps the failures); the tables are for a person at a terminal.

A failing diff ends, as pytest does, on where to look: its last line is the first
divergence (also under ``--quiet``), and where that sentence wraps, a last line of its own
names the layer and the node (one word, ``layer::node``, where the two do not fit on a line
as a phrase); the hints at its cause come under the verdict, each
once. The tables share one set of status words (pass, FAIL, drift, n/a) and a legend.
"""

from __future__ import annotations

import math
from typing import Any, TextIO

from introspect.cli.tables import Column, console_for, emit, prose, table, wraps

MAX_FAILING_ROWS = 20  # without --nodes; the rest is "… and N more"


def verdict_lines(result: Any) -> list[str]:
    """The verdict and the hints at the failure's cause: what opens the output."""
    summary = result.summary().splitlines()
    lines = summary[:1]
    if getattr(result, "rests_on_modules", False):  # a PASS module evidence carried somewhere
        lines[0] += "; module evidence covers what the recording could not see (see coverage)"
    if getattr(result, "step_rows", None):  # --generate: the first divergent step
        from introspect.diff.generation.tables import step_summary

        lines += step_summary(result)
    d = result.first_divergence
    if d is not None and getattr(d, "phase", "forward") == "forward":
        if getattr(d, "detail", ""):
            lines.append(f"  detail: {d.detail}")
        lines += [f"  hint: {h}" for h in dict.fromkeys(d.hints)]
    backward = getattr(result, "backward", None)
    if backward is not None:  # --backward: its verdict, first divergence and hints
        last = divergence_line(result)  # the backward's, where it decided: said last, once
        lines += [line for line in backward.summary().splitlines()
                  if not line.startswith("note: ") and line != last]
    return lines


def _notes(result: Any) -> list[str]:
    backward = getattr(result, "backward", None)
    return [*result.notes, *(backward.notes if backward is not None else ())]


def _first_divergence(result: Any) -> tuple[Any, str | None]:
    """The divergence the last line names (the backward's when it decided) and its sentence."""
    d = result.first_divergence
    backward = getattr(result, "backward", None)
    if backward is not None and backward.first_divergence is not None and (
            d is None or getattr(d, "phase", "forward") == "backward"):
        first = [line for line in backward.summary().splitlines()
                 if line.startswith("first backward divergence")]
        return backward.first_divergence, (first[0] if first else None)
    if d is None:
        return None, None
    from introspect.diff.records import error_words
    from introspect.diff.result import divergence_where

    return d, (f"first divergence: {d.reference_node} -> {d.candidate_node} "
               f"({divergence_where(d)}), {error_words(d)} "
               f"{d.local_max_abs_err:.3g} over budget {d.budget}")


def divergence_line(result: Any) -> str | None:
    """The first divergence in one line (the last line of a failing diff), or None."""
    return _first_divergence(result)[1]


def divergence_place(result: Any, width: int | None = None) -> str | None:
    """Where the first divergence is, as one unit: ``at encoder.layer.3, node NODE``, or None.

    A sentence wrapped at the terminal's width ends on its budget; this unit, printed
    whole under it, keeps the layer and the node on the last line a CI log's tail shows.
    Where the unit is wider than ``width`` (an indent of 4 included), it is one word that
    never wraps, layer and node joined as pytest joins a file and its test:
    ``encoder.layer.3::NODE`` (a parameter's gradient: ``encoder.layer.3::PARAMETER``).
    """
    d, _ = _first_divergence(result)
    if d is None:
        return None
    layer = d.layer or d.module
    parameter = getattr(d, "parameter", None)
    unit = f"at {layer}, node " + (f"parameter {parameter}" if parameter else d.reference_node)
    if width is None or 4 + len(unit) <= width:
        return unit
    return f"{layer}::{parameter or d.reference_node}"


def print_diff(result: Any, stream: TextIO, *, quiet: bool, all_nodes: bool,
               out: str | None = None, width: int | None = None,
               heads: Any = None) -> None:
    """Print the diff for a person on ``stream`` (stdout, or stderr when a report holds it).

    Every line fits the width (prose wrapped at spaces, a path or a node name longer than
    a line kept whole). A failing diff ends on its first divergence; a passing one with
    tables below the verdict (``--backward``) ends on its verdict again.

    ``heads``: the head-by-head parity (``HeadParity``) to report, or None.
    """
    from introspect.diff.status import layer_statuses, status_word

    console = console_for(stream, width)
    lines = verdict_lines(result)
    if not quiet:
        lines += [f"note: {n}" for n in _notes(result)]
    for line in lines:
        prose(console, line, _verdict_style(line))
    if not quiet:
        console.print()
        emit(console, layer_table(result, console.width))
        rows = shown_rows(result, all_nodes)
        words = [*layer_statuses(result), *(status_word(r.status) for r in rows)]
        if rows:
            console.print()
            emit(console, node_table(result, console.width, rows,
                                     None if all_nodes else MAX_FAILING_ROWS))
        print_legend(console, words)
    if getattr(result, "step_rows", None):
        from introspect.cli.generation_view import print_steps

        print_steps(result, stream, quiet=quiet, width=width)
    backward = getattr(result, "backward", None)
    if backward is not None and not quiet:  # --backward: the gradients' tables
        from introspect.cli.backward_view import print_backward

        print_backward(backward, console, all_rows=all_nodes)
    if heads is not None and (not quiet or not heads.all_passed):
        prose(console, heads.summary())
    if out and not quiet:
        prose(console, f"reports written to {out}")
    last = divergence_line(result)
    if last:
        prose(console, last, _verdict_style(last))
        place = divergence_place(result, console.width)
        if place and wraps(console, last):  # the last line names the layer and the node
            prose(console, "    " + place.replace(" ", "\xa0"), _verdict_style(last))
    elif backward is not None and not quiet:  # the verdict again, under the tables
        compared = f"{len(backward.parameter_rows)} parameters"
        again = f"parity holds: forward and backward ({compared})" if result.passed \
            else f"{result.verdict} ({compared})"
        prose(console, again, _verdict_style(again))


def print_legend(console: Any, words: Any) -> None:
    """The status legend: whole entries per line where they fit (never a sentence cut)."""
    from introspect.diff.status import status_legend

    text = status_legend(words).removeprefix("status: ")
    entries = [e.strip() for e in text.split("; ")]
    line = "status:"
    for entry in entries:
        candidate = f"{line} {entry};"
        if len(candidate) <= console.width or line == "status:":
            line = candidate
            continue
        prose(console, line.rstrip(";"), "dim", indent=8)
        line = f"        {entry};"
    prose(console, line.rstrip(";"), "dim", indent=8)


def layer_table(result: Any, width: int) -> Any:
    """One row per layer: status, errors, node counts and the worst node (the headers are
    ``DiffResult.layers``' columns: docs/columns.md)."""
    columns = [Column("status", 0), Column("layer", 0, flex=2, min_width=15),
               Column("max_abs_err", 9, justify="right"),
               Column("local_max_abs_err", 10, justify="right"),
               Column("nodes", 5, justify="right"), Column("failing", 7, justify="right"),
               Column("worst_node", 0, flex=5, min_width=12, cut="start", optional=True)]
    from introspect.diff.status import layer_statuses

    # int8 Linears in the candidate: what they did to each layer, in dB (Numeric Suite's SQNR)
    int8 = any(r.kind.startswith("quantized")
               for r in getattr(result.alignment, "relations", ()))
    if int8:
        columns.insert(4, Column("sqnr_db", 7, justify="right"))
    # without an op-level recording of a layer (a PASS, or a FAIL recorded only inside its
    # failing module) nothing measured that layer's output (NaN): blank, not "nan"
    measured = getattr(result, "op_level", True)
    rows = [(word, r.layer, _num(r.max_abs_err) if r.nodes and measured
             and not math.isnan(r.max_abs_err) else "",
             _num(r.local_max_abs_err) if r.nodes else "",
             *([_db(r.sqnr_db) if r.nodes else ""] if int8 else []), str(r.nodes),
             str(r.failing), r.worst_node)
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
    columns = [Column("status", 0), Column("local_max_abs_err", 10, justify="right"),
               Column("max_abs_err", 9, justify="right"),
               *([Column("atol", 8, justify="right")] if wide else []),
               Column("layer", 0, flex=2, min_width=15),
               Column("op", 0, flex=2, min_width=8, optional=True),
               Column("reference_node", 0, flex=5, cut="start"),
               *([Column("candidate_node", 0, flex=4, cut="start")] if wide else [])]
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


def _db(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}" if math.isfinite(value) else str(value)


def _verdict_style(line: str) -> str:
    if line.startswith("  hint:"):
        return "yellow"
    if "parity FAILS" in line or line.startswith("first divergence"):
        return "bold red"
    return "bold green" if "parity holds" in line else ""
