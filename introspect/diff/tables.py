"""The rows of a diff: one ``NodeDiff`` per pair or leftover node, one ``LayerDiff`` per layer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from introspect.diff.ops.align import Alignment
from introspect.diff.ops.compare.records import RunResult
from introspect.diff.records import (
    PROVEN_STRUCTURE,
    PROVEN_VALUE,
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SKIPPED,
    STATUS_UNMATCHED,
    LayerDiff,
    NodeDiff,
)
from introspect.diff.tolerance import Budget
from introspect.graph import IntrospectGraph
from introspect.tracing.records import NodeRecord


def _shape_text(record: NodeRecord) -> str:
    return record.shapes or record.value


def node_rows(alignment: Alignment, run: RunResult, budgets: Sequence[Budget],
              reference: IntrospectGraph, candidate: IntrospectGraph, *,
              allow_nonfinite: bool = False) -> list[NodeDiff]:
    """One row per pair, per node without counterpart and per skipped node, in graph order.

    A pair fails when its local error is over budget, or when either side's value holds
    NaN or Inf (unless ``allow_nonfinite``): equal NaNs on both sides prove nothing.
    """
    ref_records = {r.name: r for r in reference.records}
    cand_records = {r.name: r for r in candidate.records}
    keyed: list[tuple[tuple[float, int, int], NodeDiff]] = []
    for i, pair in enumerate(alignment.pairs):
        ref, cand = ref_records[pair.reference], cand_records[pair.candidate]
        propagated, local = run.propagated.get(i), run.local.get(i)
        note = "; ".join(n for n in (pair.note, _region_note(pair), run.layouts.get(i, ""),
                                     run.errors.get(i, "")) if n)
        nonfinite = max(propagated.nonfinite, propagated.reference_nonfinite) \
            if propagated else 0
        if propagated is None or local is None:
            status = STATUS_UNMATCHED
        elif local.mismatched or (nonfinite and not allow_nonfinite):
            status = STATUS_FAIL
        elif propagated.mismatched:
            status = STATUS_DRIFT
        else:
            status = STATUS_OK
        shape = _shape_text(ref)
        if pair.reference_region is not None:
            shape = f"{shape}{pair.reference_region}"
        dtype = ref.dtype if ref.dtype == cand.dtype else f"{ref.dtype}/{cand.dtype}"
        row = NodeDiff(
            reference_node=ref.name, candidate_node=cand.name, module=ref.module,
            layer=ref.layer, op=ref.op_type, shape=shape, dtype=dtype,
            max_abs_err=propagated.max_abs if propagated else None,
            mean_abs_err=propagated.mean_abs if propagated else None,
            max_rel_err=propagated.max_rel if propagated else None,
            mismatched=propagated.mismatched if propagated else None,
            nonfinite=nonfinite if propagated else None,
            local_max_abs_err=local.max_abs if local else None,
            local_mean_abs_err=local.mean_abs if local else None,
            local_max_rel_err=local.max_rel if local else None,
            local_mismatched=local.mismatched if local else None,
            pad_max_abs_err=propagated.pad_max_abs if propagated else None,
            atol=budgets[i].atol, rtol=budgets[i].rtol, status=status,
            matched_by=pair.matched_by, note=note,
            reference_index=ref.index, candidate_index=cand.index,
            sqnr_db=propagated.sqnr_db if propagated else None,
            local_sqnr_db=local.sqnr_db if local else None,
            provenance=_provenance(pair, propagated, local),
        )
        keyed.append(((ref.index, 0, cand.index), row))
    cand_anchor = _candidate_positions(alignment, ref_records, cand_records, candidate)
    for u in [*alignment.unmatched, *alignment.skipped]:
        records = ref_records if u.graph == "reference" else cand_records
        record = records[u.node]
        row = NodeDiff(
            reference_node=u.node if u.graph == "reference" else "",
            candidate_node=u.node if u.graph == "candidate" else "",
            module=record.module, layer=record.layer, op=record.op_type,
            shape=_shape_text(record), dtype=record.dtype,
            max_abs_err=None, mean_abs_err=None, max_rel_err=None, mismatched=None,
            nonfinite=None, local_max_abs_err=None, local_mean_abs_err=None,
            local_max_rel_err=None, local_mismatched=None, pad_max_abs_err=None,
            atol=None, rtol=None, status=u.status, matched_by="", note=u.reason,
            reference_index=record.index if u.graph == "reference" else -1,
            candidate_index=record.index if u.graph == "candidate" else -1,
        )
        position = record.index if u.graph == "reference" else cand_anchor.get(u.node, math.inf)
        keyed.append(((position, 1 if u.graph == "candidate" else 0, record.index), row))
    keyed.sort(key=lambda item: (item[1].status == STATUS_SKIPPED, item[0]))
    return [row for _, row in keyed]


def _provenance(pair: Any, propagated: Any, local: Any) -> str:
    """The pair's provenance, a guess upgraded to ``value`` where the candidate's own
    value agrees with the reference's. Agreeing only locally (the same op on the inputs
    the pairing gave it) proves nothing where those inputs were paired by a guess: a view
    of a guessed Linear would vouch for the guess it follows."""
    if pair.provenance != PROVEN_STRUCTURE or propagated is None or local is None:
        return str(pair.provenance)
    if not (propagated.mismatched or propagated.nonfinite):
        return PROVEN_VALUE
    return PROVEN_STRUCTURE


def _region_note(pair: Any) -> str:
    if pair.reference_region is not None:
        return f"compared with the reference's {pair.reference_region}"
    if pair.candidate_region is not None:
        return f"the candidate's {pair.candidate_region} compared"
    return ""


def _candidate_positions(alignment: Alignment, ref_records: Mapping[str, NodeRecord],
                         cand_records: Mapping[str, NodeRecord],
                         candidate: IntrospectGraph) -> dict[str, float]:
    """Where a candidate-only node sits in the reference's order: just before the next pair."""
    paired = sorted((cand_records[p.candidate].index, ref_records[p.reference].index)
                     for p in alignment.pairs)
    positions: dict[str, float] = {}
    for u in [*alignment.unmatched, *alignment.skipped]:
        if u.graph != "candidate":
            continue
        index = cand_records[u.node].index
        later = [ref for cand, ref in paired if cand > index]
        positions[u.node] = (min(later) - 0.5) if later else math.inf
    return positions


def layer_rows(rows: Sequence[NodeDiff], records: Sequence[NodeRecord]) -> list[LayerDiff]:
    order: dict[str, int] = {}
    for r in records:
        order.setdefault(r.layer, r.index)
    groups: dict[str, list[NodeDiff]] = {}
    unmatched: dict[str, int] = {}
    for row in rows:
        if row.status == STATUS_SKIPPED:
            continue
        if row.status == STATUS_UNMATCHED and not row.candidate_node:
            unmatched[row.layer] = unmatched.get(row.layer, 0) + 1
        if row.reference_node and row.candidate_node and row.local_max_abs_err is not None:
            groups.setdefault(row.layer, []).append(row)
    layers = []
    for layer in sorted(set(groups) | set(unmatched), key=lambda name: order.get(name, 1 << 30)):
        members = groups.get(layer, [])
        tensors = [m for m in members if m.max_abs_err is not None]
        output = max(tensors, key=lambda m: (m.reference_index, m.candidate_index), default=None)
        failing = [m for m in members if m.status == STATUS_FAIL]
        erring = [m for m in members if m.local_max_abs_err]
        worst = max(failing or erring, key=lambda m: (_over(m), m.local_max_abs_err or 0.0),
                    default=None)
        layers.append(LayerDiff(
            layer=layer,
            output_node=output.reference_node if output else "",
            max_abs_err=max((m.max_abs_err or 0.0 for m in tensors
                             if m.reference_index == output.reference_index), default=0.0)
            if output else 0.0,
            local_max_abs_err=max((m.local_max_abs_err or 0.0 for m in members), default=0.0),
            worst_node=worst.reference_node if worst else "",
            nodes=len(members), failing=len(failing), unmatched=unmatched.get(layer, 0),
            passed=not failing,
            sqnr_db=min((m.sqnr_db for m in tensors if m.sqnr_db is not None
                         and m.reference_index == output.reference_index), default=None)
            if output else None,
        ))
    return layers


def _over(row: NodeDiff) -> float:
    """How many times over budget a row's local error is (roughly, at its largest error)."""
    if row.local_max_abs_err is None or row.atol is None:
        return 0.0
    return row.local_max_abs_err / row.atol if row.atol > 0 else (
        math.inf if row.local_max_abs_err > 0 else 0.0)


__all__ = ["layer_rows", "node_rows"]
