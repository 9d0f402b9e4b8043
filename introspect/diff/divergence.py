"""The first divergence: where the candidate starts computing something else, and why."""

from __future__ import annotations

from collections.abc import Sequence

from introspect.diff.align import Alignment
from introspect.diff.compare import Padding, RunResult
from introspect.diff.hints import explain
from introspect.diff.records import STATUS_FAIL, Divergence, NodeDiff
from introspect.diff.tolerance import Budget
from introspect.graph import IntrospectGraph


def first_divergence(rows: Sequence[NodeDiff], alignment: Alignment, run: RunResult,
                     reference: IntrospectGraph, candidate: IntrospectGraph,
                     padding: Padding, budgets: Sequence[Budget]) -> Divergence | None:
    first = next((r for r in rows if r.status == STATUS_FAIL), None)
    if first is None:
        return None
    index = next(i for i, p in enumerate(alignment.pairs)
                 if p.reference == first.reference_node and p.candidate == first.candidate_node)
    pair = alignment.pairs[index]
    padded_rows = tuple(bool(x) for x in padding.padded.any(dim=1)) \
        if padding.padded is not None else ()
    hints = explain(pair, reference, candidate, alignment.relations, run.snapshots.get(index),
                    padded_rows)
    return Divergence(first.reference_node, first.candidate_node, first.module, first.layer,
                      first.op, float(first.local_max_abs_err or 0.0), str(budgets[index]), hints)


__all__ = ["first_divergence"]
