"""Drift: an error that no single node's budget sees, but that rounding cannot explain.

A bug can hide below every node's local budget and still change the model's answer: an
RMSNorm eps of 1e-5 instead of 1e-6 changes ``var + eps`` by 9e-6, under fp32's atol of
1e-5, yet moves Llama's outputs by 1e-2. Each compared value's own (propagated) error is
therefore also held against what rounding can do to a value of its size: its largest
error relative to its largest magnitude must stay under ``DRIFT_RTOL`` of the lowest
precision either model computes in.

The limits were calibrated on correct implementations against the fp32 reference
(MiniLM: sdpa vs eager, our from-scratch BERT, the model cast to bf16 and fp16; Llama
cast to bf16 and fp16): the worst relative error measured anywhere in those graphs was
1.9e-6 in fp32, 1.9e-3 in fp16 and 1.3e-2 in bf16. Each limit sits 7x to 50x above it.
The faults they must catch measured 6e-3 (Llama's RMSNorm eps off by a decade, at its
output) and 1.6e-3 (BERT's LayerNorm eps at the torch default 1e-5 instead of 1e-12).

That eps is now found at its ``add`` first (``ops.twins``: the same op on the same values
must agree to a few roundings); drift stays the backstop where the slip sits in no such
pair.

When drift fails a diff that no local error failed, the first divergence is the node
where the drift starts: of the pairs up to the first drifting one, the one whose local
error is largest against its own budget; where no pair has any local error (the
difference comes from nodes with no counterpart), the first pair whose values differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from introspect.diff.ops.align import Alignment
from introspect.diff.ops.compare.records import RunResult
from introspect.diff.records import STATUS_FAIL, NodeDiff
from introspect.diff.tolerance import Budget

# Largest error relative to the value's largest magnitude that rounding explains.
# TF32 (CUDA float32 matmuls, introspect.diff.devices): 5.1e-4 measured at BERT-base's
# output with TF32's rounding applied to every Linear (2.4e-4 on MiniLM); 10x above it.
# int8 quantized Linears (``qint8``: ``introspect.diff.quantized``): their rounding, carried
# through a trained model, moved values by up to 0.48 of their own magnitude (MiniLM's
# attention, ``quantize_dynamic``; 0.03 on bert-tiny), so drift cannot tell it from a bug:
# only an error larger than the value itself is drift there, and each node's local budget
# (int8's own for the quantized Linears, the dtype's for the rest) does the judging.
DRIFT_RTOL = {"float64": 1e-9, "float32": 1e-4, "tfloat32": 5e-3, "float16": 2e-2,
              "bfloat16": 1e-1, "qint8": 1.0}


@dataclasses.dataclass(frozen=True)
class Drift:
    """The first pair, in the reference's order, whose error rounding cannot explain."""

    pair_index: int
    max_abs: float
    limit: float
    start_index: int  # the pair where it starts: largest local error against its budget
    start_ratio: float  # that pair's local error in units of its budget


def drift_limit(dtypes: Sequence[str], scale: float, atol: float) -> float:
    """What rounding explains for a value of largest magnitude ``scale``."""
    rtol = max((DRIFT_RTOL[d] for d in dtypes if d in DRIFT_RTOL), default=0.0)
    return atol + rtol * scale


def find_drift(alignment: Alignment, run: RunResult, budgets: Sequence[Budget],
               reference_order: dict[str, int], pair_dtypes: Sequence[Sequence[str]],
               model_dtypes: Sequence[str], unconfirmed: Collection[str] = ()) -> Drift | None:
    """The first drifting pair and where its drift starts, or None.

    Args:
        alignment, run, budgets: the diff's pairs, measurements and budgets.
        reference_order: each reference node's position in its graph.
        pair_dtypes: each pair's dtypes (reference, candidate).
        model_dtypes: the floating dtypes the two models hold their weights in (a value
            computed in fp32 from bf16 weights carries bf16's rounding).
        unconfirmed: reference nodes whose pair holds two different quantities (terms
            regrouped: ``divergence.confirm_failures``), or may (a guess whose values
            disagree, and the views of one): their values may differ freely. A fault
            behind them still drifts at the proven pairs it reaches.
    """
    order = sorted(range(len(alignment.pairs)),
                   key=lambda i: reference_order[alignment.pairs[i].reference])
    best: tuple[float, int] | None = None
    first_apart: int | None = None  # the first pair whose values differ at all
    for i in order:
        stats, local, budget = run.propagated.get(i), run.local.get(i), budgets[i]
        if stats is None:
            continue
        if first_apart is None and stats.max_abs > 0:
            first_apart = i
        if budget.atol == 0.0 and budget.rtol == 0.0:
            continue  # integers are compared exactly: the local budget says it all
        if local is not None:
            ratio = local.max_abs / (budget.atol + budget.rtol * stats.reference_max_abs)
            if ratio > 0 and (best is None or ratio > best[0]):
                best = (ratio, i)
        limit = drift_limit([*model_dtypes, *pair_dtypes[i]], stats.reference_max_abs,
                            budget.atol)
        if stats.max_abs > limit and alignment.pairs[i].reference not in unconfirmed:
            # (an unconfirmed pair holds two quantities: its values may differ freely)
            # no local error anywhere (the difference comes from nodes with no
            # counterpart): the drift starts where the values first part
            start = best or (0.0, first_apart if first_apart is not None else i)
            return Drift(i, stats.max_abs, limit, start[1], start[0])
    return None


def mark_drift(rows: list[NodeDiff], alignment: Alignment, drift: Drift) -> list[NodeDiff]:
    """The row where drift starts fails, with a note that says why."""
    start = alignment.pairs[drift.start_index]
    seen = alignment.pairs[drift.pair_index]
    where = (f"its local error is {drift.start_ratio:.2g}x its budget, the largest before "
             f"{seen.reference}" if drift.start_ratio > 0
             else "the values first differ here, and no node's own error explains "
             f"{seen.reference}")
    note = (f"drift starts here: {where}, whose error {drift.max_abs:.3g} is beyond what "
            f"rounding explains ({drift.limit:.3g})")
    marked = []
    for row in rows:
        if (row.reference_node, row.candidate_node) == (start.reference, start.candidate):
            row = dataclasses.replace(row, status=STATUS_FAIL,
                                      note=f"{row.note}; {note}" if row.note else note)
        marked.append(row)
    return marked


__all__ = ["DRIFT_RTOL", "Drift", "drift_limit", "find_drift", "mark_drift"]
