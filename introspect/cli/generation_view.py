"""What ``introspect diff --generate`` adds to the terminal: one row per decoding step."""

from __future__ import annotations

from typing import Any, TextIO

from introspect.cli.tables import Column, console_for, emit, prose, table


def print_steps(result: Any, stream: TextIO, *, quiet: bool, width: int | None = None) -> None:
    """The per-step table (after the layer table of the step shown); nothing with --quiet,
    whose verdict already names the first divergent step and node."""
    if quiet or not getattr(result, "step_rows", None):
        return
    from introspect.diff.generation.tables import token_text

    console = console_for(stream, width)
    # The tokens' columns sized from the data (an id is a number: never cut), at most 24
    # characters; the node column takes what is left.
    tokens = max((len(token_text(r, side)) for r in result.step_rows
                  for side in ("reference", "candidate")), default=9)
    tokens = max(9, min(tokens, 24))
    columns = [Column("status", 0), Column("step", 4, justify="right"),
               Column("position", 8, justify="right"), Column("reference", tokens),
               Column("candidate", tokens),
               Column("logits_max_abs_err", 10, justify="right"),
               Column("first_node / cache", 0, flex=4, min_width=16, cut="fold")]
    rows = []
    for r in result.step_rows:
        where = r.first_node and f"{r.first_node} ({r.op} in {r.module or r.layer})"
        where = "; ".join(x for x in (where, r.cache and f"cache: {r.cache}") if x)
        rows.append(("pass" if r.passed else "FAIL", str(r.step), str(r.position),
                     token_text(r, "reference"), token_text(r, "candidate"),
                     f"{r.logits_max_abs_err:.3g}", where))
    console.print()
    emit(console, table(columns, rows, width=min(console.width, 140),
                        title="generation steps (teacher-forced on the reference's tokens)"))
    generated = result.generated
    if generated is not None and generated.reference_pieces and any(generated.reference_pieces):
        prose(console, f"reference: {generated.prompt_text}|"
                       f"{''.join(generated.reference_pieces)}", indent=9)
        prose(console, f"candidate: {generated.prompt_text}|"
                       f"{''.join(generated.candidate_pieces)}", indent=9)


__all__ = ["print_steps"]
