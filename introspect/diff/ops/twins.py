"""Twin ops: the same pointwise op on the same values must give the same values.

A pair whose two nodes are one pointwise op of one kind (``add``, ``mul``, ``rsqrt``,
...), each data input of the candidate's paired with the same input of the reference's,
is replayed on exactly the reference's values: the side-by-side run substitutes them. Its
local error can then come only from the op's other arguments (a constant: an eps, a scale)
or from a kernel's own rounding (a vectorised ``exp`` against a scalar one: an ulp or two).
The dtype's budget (fp32: atol 1e-5) is sized for errors carried through sums and is far
wider than that: an RMSNorm eps of 1e-5 for 1e-6 moves ``ms + eps`` by 9e-6, under it, and
its outputs by less than theirs. Such a pair fails where its local error is over
``TWIN_UNITS`` roundings of its value's largest magnitude.

Only plain pairs count (no region, feature order or bias taken apart), and only ops whose
other tensor arguments hold one element at most: a weight multiplied in is the weights'
business (``align.weights``), not a constant's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import torch
import torch.fx

from introspect.diff.modules.local import UNIT
from introspect.diff.ops.align import Alignment
from introspect.diff.ops.align.view import OP_KINDS
from introspect.diff.ops.compare.records import RunResult
from introspect.diff.records import STATUS_DRIFT, STATUS_FAIL, STATUS_OK, NodeDiff, Pair
from introspect.diff.tolerance import Budget
from introspect.graph import IntrospectGraph

# Roundings of a twin pair's largest magnitude that its local error may reach: a kernel
# computes a transcendental within a few ulps; the same correctly rounded op, within none.
TWIN_UNITS = 16.0
# Pointwise ops: each output element from the same elements of the inputs.
_POINTWISE = {"add", "sub", "mul", "div", "rsqrt", "sqrt", "pow", "exp", "log", "tanh",
              "sigmoid", "neg", "reciprocal", "clamp", "clamp_min", "clamp_max", "relu",
              "silu", "abs", "erf"}
_COMMUTATIVE = {"add", "mul"}


def twin_pairs(alignment: Alignment, reference: IntrospectGraph,
               candidate: IntrospectGraph) -> set[int]:
    """The indices of ``alignment.pairs`` that are twin ops (see the module's docstring)."""
    plain = {(p.reference, p.candidate) for p in alignment.pairs if _plain(p)}
    ref_nodes = {n.name: n for n in reference.gm.graph.nodes}
    cand_nodes = {n.name: n for n in candidate.gm.graph.nodes}
    ref_records = {r.name: r for r in reference.records}
    cand_records = {r.name: r for r in candidate.records}
    ref_constant, cand_constant = _constants(reference.gm), _constants(candidate.gm)
    found = set()
    for i, pair in enumerate(alignment.pairs):
        if (pair.reference, pair.candidate) not in plain:
            continue
        ref, cand = ref_nodes.get(pair.reference), cand_nodes.get(pair.candidate)
        if ref is None or cand is None:
            continue
        kind = _kind(ref_records[ref.name].op_type)
        if kind not in _POINTWISE or _kind(cand_records[cand.name].op_type) != kind \
                or ref.op not in ("call_function", "call_method") \
                or cand.op not in ("call_function", "call_method") \
                or ref_records[ref.name].shape != cand_records[cand.name].shape:
            continue
        ref_data = _data_inputs(ref, ref_constant, ref_records)
        cand_data = _data_inputs(cand, cand_constant, cand_records)
        if not ref_data or not cand_data or len(ref_data) != len(cand_data):
            continue
        if kind in _COMMUTATIVE:
            same = _as_paired(ref_data, cand_data, plain)
        else:
            same = all((r, c) in plain for r, c in zip(ref_data, cand_data, strict=True))
        if same:
            found.add(i)
    return found


def hold_twins(rows: Sequence[NodeDiff], alignment: Alignment, run: RunResult,
               twins: set[int], dtypes: Sequence[tuple[str, str]],
               budgets: Sequence[Budget]) -> tuple[list[NodeDiff], list[Budget]]:
    """``rows``, each twin pair whose local error is over ``TWIN_UNITS`` roundings of its
    value's largest magnitude failing, with a note that says why; ``budgets``, theirs
    that limit."""
    budgets = list(budgets)
    limits: dict[tuple[str, str], tuple[float, bool]] = {}
    for i in twins:
        local = run.local.get(i)
        unit = max(_unit(d) for d in dtypes[i])
        if local is None or unit == 0.0 or local.max_abs == 0.0:
            continue
        limit = TWIN_UNITS * unit * local.reference_max_abs
        if local.max_abs > limit:
            pair = alignment.pairs[i]
            propagated = run.propagated.get(i)
            apart = propagated is not None and propagated.max_abs > limit  # its own value
            limits[(pair.reference, pair.candidate)] = (limit, apart)
            budgets[i] = Budget(limit, 0.0)
    held = []
    for row in rows:
        found = limits.get((row.reference_node, row.candidate_node))
        if found is not None and row.status in (STATUS_OK, STATUS_DRIFT) \
                and not row.nonfinite:
            limit, apart = found
            note = (f"the same {row.op} on the same values, yet {row.local_max_abs_err:.3g} "
                    f"apart: over {TWIN_UNITS:g} roundings of its largest magnitude "
                    f"({limit:.3g}); one of its other arguments differs (a constant: an eps, "
                    "a scale?)")
            row = dataclasses.replace(row, status=STATUS_FAIL, atol=limit, rtol=0.0,
                                      local_mismatched=max(row.local_mismatched or 0, 1),
                                      mismatched=max(row.mismatched or 0, int(apart)),
                                      note=f"{row.note}; {note}" if row.note else note)
        held.append(row)
    return held, budgets


def _unit(dtype: str) -> float:
    """One rounding of the dtype named (``modules.local.UNIT``); 0 for none it knows."""
    found = getattr(torch, dtype, None)
    return UNIT.get(found, 0.0) if isinstance(found, torch.dtype) else 0.0


def _plain(pair: Pair) -> bool:
    return pair.reference_region is None and pair.candidate_region is None \
        and pair.feature_order is None and not pair.reference_bias


def _kind(op_type: str) -> str:
    """The op's kind: ``iadd``, ``__add__`` and ``add_`` are ``add``."""
    if op_type in OP_KINDS:
        return OP_KINDS[op_type]
    name = op_type.strip("_")
    if name in OP_KINDS:
        return OP_KINDS[name]
    if name.startswith("i") and name[1:] in _POINTWISE:
        return name[1:]
    return name


def _constants(gm: torch.fx.GraphModule) -> set[str]:
    """The nodes computed from weights and buffers alone (no input reaches them)."""
    constant: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" or (node.op in ("call_function", "call_method")
                                     and node.all_input_nodes
                                     and all(n.name in constant for n in node.all_input_nodes)):
            constant.add(node.name)
    return constant


def _data_inputs(node: torch.fx.Node, constant: set[str], records: dict) -> list[str] | None:
    """The node's inputs that depend on the model's inputs, in argument order; None where
    a constant tensor of more than one element is among the others (a weight)."""
    data = []
    for n in node.all_input_nodes:
        if n.name in constant:
            if records.get(n.name) is None or records[n.name].numel > 1:
                return None
        else:
            data.append(n.name)
    return data


def _as_paired(reference: list[str], candidate: list[str],
               plain: set[tuple[str, str]]) -> bool:
    """Each candidate input paired with a reference input, one for one (any order)."""
    left = Counter(reference)
    for c in candidate:
        match = next((r for r in left if left[r] and (r, c) in plain), None)
        if match is None:
            return False
        left[match] -= 1
    return True


__all__ = ["TWIN_UNITS", "hold_twins", "twin_pairs"]
