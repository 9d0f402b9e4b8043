"""The steps and caches of a generation diff as frames and as plain text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from introspect.diff.generation.records import CacheDiff, StepDiff

if TYPE_CHECKING:
    import pandas


def steps_frame(rows: Sequence[StepDiff]) -> pandas.DataFrame:
    import pandas as pd

    return pd.DataFrame([asdict(r) for r in rows], columns=list(StepDiff.__dataclass_fields__))


def caches_frame(rows: Sequence[CacheDiff]) -> pandas.DataFrame:
    import pandas as pd

    return pd.DataFrame([asdict(r) for r in rows], columns=list(CacheDiff.__dataclass_fields__))


def token_text(row: StepDiff, side: str) -> str:
    token = row.reference_token if side == "reference" else row.candidate_token
    text = row.reference_text if side == "reference" else row.candidate_text
    if token < 0:
        return "-"
    return f"{token} {text!r}" if text else str(token)


def step_table(result: Any) -> str:
    """The per-step table as fixed-width text."""
    lines = [f"{'step':>4} {'pos':>4}  {'reference':<16} {'candidate':<16} "
             f"{'logits err':>10}  {'status':<6} first divergent node / cache"]
    for r in result.step_rows:
        where = r.first_node and f"{r.first_node} ({r.op} in {r.module or r.layer})"
        where = "; ".join(x for x in (where, r.cache and f"cache: {r.cache}") if x)
        lines.append(f"{r.step:>4} {r.position:>4}  {token_text(r, 'reference')[:16]:<16} "
                     f"{token_text(r, 'candidate')[:16]:<16} {r.logits_max_abs_err:>10.3g}  "
                     f"{'pass' if r.passed else 'FAIL':<6} {where}")
    return "\n".join(lines)


def step_summary(result: Any) -> list[str]:
    """The lines the summary adds: the first divergent step, and the step's hints."""
    failing = [r for r in result.step_rows if not r.passed]
    steps = len(result.step_rows)
    if not failing:
        unheld = sum(not r.passed for r in result.cache_rows)
        caches = ("every cached key and value within budget" if not unheld else
                  f"{unheld} cached tensor(s) in no layout of the reference's (see the notes)")
        return [f"generation: {steps} step(s) (prefill + {steps - 1}), every step within "
                f"budget; {caches}" if unheld else
                f"generation: {steps} step(s) (prefill + {steps - 1}), every step and {caches}"]
    first = failing[0]
    where = first.first_node and f"node {first.first_node} ({first.op} in " \
                                 f"{first.module or first.layer})"
    where = where or (f"cache: {first.cache}" if first.cache else "the step failed")
    return [f"first divergent step: {first.step} (position {first.position}), {where}; "
            f"{len(failing)} of {steps} step(s) fail"]


def verdict_lines(result: Any) -> list[str]:
    """For --quiet: the first divergent step and node."""
    return step_summary(result)[:1]


__all__ = ["caches_frame", "step_summary", "step_table", "steps_frame", "token_text",
           "verdict_lines"]
