"""Known causes of a divergence, recognised at the node where it starts.

Each check looks at the first over-budget pair (its op, the weights it reads, the
constants around it and, where the run kept them, its inputs and outputs) and says what
it recognises, in a sentence a user can act on:

- a weight that differs from the reference's (left unloaded, perturbed, another
  checkpoint), or that is the reference's transposed (one that holds the reference's
  rearranged by a reshape is left to ``hypotheses.weights``, which names it);
- LayerNorm epsilon;
- the tanh approximation of GELU against the exact (erf) one;
- the attention scale (q·kᵀ multiplied by something else than 1/sqrt(head size));
- the attention mask (errors only in the padded sequences of the batch);
- a lower-precision dtype, whose rounding alone exceeds the default budget.

Example::

    >>> explain(pair, reference_graph, candidate_graph, alignment.relations, snapshot, padding)
    ('LayerNorm eps differs: reference 1e-12, candidate 1e-05',)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from introspect.diff.ops.outside import handed_values
from introspect.diff.records import Pair, WeightRelation

_SEARCH_DEPTH = 12  # nodes walked back from a pair to find attention scales
# The hint of last resort, on dtypes alone: dropped beside a hypothesis that reproduces
# the candidate's values (``ops.divergence``)
ROUNDING = "rounding alone can exceed"


def explain(pair: Pair, reference: Any, candidate: Any, relations: Sequence[WeightRelation],
            snapshot: Any | None = None, padded_rows: Sequence[bool] = (), *,
            noise_budget: bool = False) -> tuple[str, ...]:
    """Hints for an over-budget pair, most specific first (empty when nothing matches).

    Args:
        pair: the pair whose local error is over budget.
        reference, candidate: the two ``IntrospectGraph``s (their ``gm`` and ``records``).
        relations: the alignment's weight relations.
        snapshot: the pair's inputs and outputs, when the run kept them.
        padded_rows: for each batch row, whether it holds padding.
        noise_budget: the budgets already follow each node's measured noise (no hint to
            turn it on, then).
    """
    ref_node = _node(reference.gm, pair.reference)
    cand_node = _node(candidate.gm, pair.candidate)
    hints: list[str] = []
    hints += _weight_hints(candidate.gm, cand_node, relations, reference.gm,
                           _linear_like(reference.gm, ref_node))
    hints += _layer_norm_hints(reference.gm, ref_node, candidate.gm, cand_node)
    hints += _gelu_hints(reference.gm, ref_node, candidate.gm, cand_node, snapshot)
    hints += _scale_hints(reference, ref_node, candidate, cand_node)
    hints += _mask_hints(snapshot, padded_rows, hints)
    if not hints:  # (rounding is the explanation of last resort: beside a hint that
        # reproduces the candidate's values, it pointed a float64 port's user at rounding)
        hints += _dtype_hints(reference, pair, candidate, noise_budget)
    return tuple(dict.fromkeys(hints))


def _node(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def _weight_labels(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[str]:
    labels = []
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        labels += [f"{node.target}.{p}" for p, _ in module.named_parameters()]
    # (a value computed during the call where the recording does not reach, in a worker
    # thread or NumPy, is no weight: ``ops.outside``)
    outside = handed_values(gm)
    labels += [str(n.target) for n in node.all_input_nodes
               if n.op == "get_attr" and str(n.target) not in outside
               and _floating_attribute(gm, str(n.target))]
    return labels


def _floating_attribute(gm: torch.fx.GraphModule, target: str) -> bool:
    """The recorded constant at ``target`` holds floating values: a weight may; a boolean
    attention mask the recording kept as a constant is none (probe round s: "weight
    _tensor_constant0 matches no weight of the reference")."""
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return not isinstance(value, torch.Tensor) or value.is_floating_point()


def _linear_like(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``node`` is a Linear (a module or ``F.linear``): it reads a weight (out, in)."""
    return node.op == "call_module" and isinstance(
        gm.get_submodule(str(node.target)), torch.nn.Linear) or getattr(
        node.target, "__name__", "") == "linear"


def _weight_hints(gm: torch.fx.GraphModule, node: torch.fx.Node,
                  relations: Sequence[WeightRelation],
                  reference_gm: torch.fx.GraphModule | None = None,
                  reference_linear: bool = True) -> list[str]:
    """Hints on the weights ``node`` reads. ``reference_linear``: the reference's node it
    pairs with is a Linear too; where it is not (GPT-2's Conv1D multiplies by a weight
    stored (in, out)), a Linear of the candidate holding it transposed is right."""
    hints = []
    linear_like = _linear_like(gm, node) and reference_linear
    for label in _weight_labels(gm, node):
        found = [r for r in relations if r.candidate == label]
        if _rearranged(gm, label, reference_gm, [r.reference for r in found]):
            continue  # loaded, rearranged by a reshape: the hypotheses say how
        scaled = _scaled_reference(gm, label, reference_gm) if not found else None
        if scaled is not None:
            from introspect.diff.hypotheses.weights import scaled_hint

            hints.append(scaled_hint(scaled[0], label, scaled[1]))
        elif not found:
            hints.append(f"weight {label} matches no weight of the reference, by value or "
                         "by name: a weight left unloaded, or loaded from another model")
        for r in found:
            if r.kind.startswith("by-name") and r.max_abs_diff > 0:
                hints.append(f"weight {label} differs from the reference's {r.reference} by up "
                             f"to {r.max_abs_diff:.3g}: a weight left unloaded (still at its "
                             "initial values), perturbed, or loaded from another checkpoint")
            if r.kind == "transposed" and linear_like:
                hints.append(f"weight {label} is the reference's {r.reference} transposed, but "
                             "a Linear expects (out_features, in_features): a transposed weight")
    return hints


def _scaled_reference(gm: torch.fx.GraphModule, label: str,
                      reference_gm: torch.fx.GraphModule | None) -> tuple[str, float] | None:
    """(the reference's weight, the factor) that the candidate's ``label`` holds scaled."""
    from introspect.diff.hypotheses.weights import scale_between

    tensor = _tensor(gm, label)
    if tensor is None or reference_gm is None:
        return None
    for name, value in reference_gm.named_parameters():
        factor = scale_between(tensor, value)
        if factor is not None:
            return name, factor
    return None


def _tensor(gm: torch.nn.Module, label: str) -> torch.Tensor | None:
    """The parameter or buffer at ``label`` (a dotted path) in ``gm``, or None."""
    value: Any = gm
    for part in label.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value if isinstance(value, torch.Tensor) else None


def _rearranged(gm: torch.fx.GraphModule, label: str,
                reference_gm: torch.fx.GraphModule | None, named: Sequence[str]) -> bool:
    """Whether the candidate's weight ``label`` holds a reference weight (those ``named``
    by the relations, else any) rearranged by a reshape."""
    from introspect.diff.hypotheses.weights import rearrangement

    tensor = _tensor(gm, label)
    if tensor is None or reference_gm is None or tensor.dim() != 2:
        return False
    candidates = [t for t in (_tensor(reference_gm, n) for n in named) if t is not None] \
        if named else [t for _, t in reference_gm.named_parameters()]
    return any(rearrangement(tensor, t, "") is not None for t in candidates)


def _layer_norm_eps(gm: torch.fx.GraphModule, node: torch.fx.Node) -> float | None:
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        return float(module.eps) if isinstance(module, torch.nn.LayerNorm) else None
    if getattr(node.target, "__name__", "") == "layer_norm":
        eps: Any = node.kwargs.get("eps", node.args[4] if len(node.args) > 4 else 1e-5)
        return float(eps)
    return None


def _layer_norm_hints(ref_gm: torch.fx.GraphModule, ref_node: torch.fx.Node,
                      cand_gm: torch.fx.GraphModule, cand_node: torch.fx.Node) -> list[str]:
    ref_eps, cand_eps = _layer_norm_eps(ref_gm, ref_node), _layer_norm_eps(cand_gm, cand_node)
    if ref_eps is not None and cand_eps is not None and ref_eps != cand_eps:
        return [f"LayerNorm eps differs: reference {ref_eps:g}, candidate {cand_eps:g}"]
    return []


def _gelu_hints(ref_gm: torch.fx.GraphModule, ref_node: torch.fx.Node,
                cand_gm: torch.fx.GraphModule, cand_node: torch.fx.Node,
                snapshot: Any | None) -> list[str]:
    if snapshot is None:
        return []
    tensors = [t for t in snapshot.inputs if isinstance(t, torch.Tensor)]
    if len(tensors) != 1:
        return []
    x = tensors[0]
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() \
            or x.shape != snapshot.reference_output.shape:
        return []
    exact, approximate = F.gelu(x.double()), F.gelu(x.double(), approximate="tanh")
    ref_out, cand_out = snapshot.reference_output.double(), snapshot.local_output.double()

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a - b).abs().max()) <= 1e-5 * max(1.0, float(b.abs().max()))

    gap = float((exact - approximate).abs().max())
    if close(ref_out, exact) and close(cand_out, approximate):
        return [f"the candidate uses the tanh approximation of GELU where the reference uses "
                f"the exact (erf) GELU; they differ by up to {gap:.3g}"]
    if close(ref_out, approximate) and close(cand_out, exact):
        return [f"the candidate uses the exact (erf) GELU where the reference uses the tanh "
                f"approximation; they differ by up to {gap:.3g}"]
    return []


def attention_scales(graph: Any, node: torch.fx.Node) -> set[float]:
    """Factors applied to q·kᵀ found near ``node``: sdpa's scale, or a constant mul/div."""
    records = {r.name: r for r in graph.records}
    scales: set[float] = set()
    seen, frontier = {node}, [node]
    for _ in range(_SEARCH_DEPTH):
        nxt = []
        for n in frontier:
            scale = _scale_of(n, records)
            if scale is not None:
                scales.add(scale)
                continue
            for i in n.all_input_nodes:
                if i not in seen:
                    seen.add(i)
                    nxt.append(i)
        frontier = nxt
    return scales


def _scale_of(n: torch.fx.Node, records: dict[str, Any]) -> float | None:
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    if name == "scaled_dot_product_attention":
        scale = n.kwargs.get("scale")
        if scale is None and len(n.args) > 6:
            scale = n.args[6]
        if scale is None and isinstance(n.args[0], torch.fx.Node):
            query = records.get(n.args[0].name)
            if query is not None and query.shape:
                return 1.0 / math.sqrt(query.shape[-1])
        return float(scale) if isinstance(scale, (int, float)) else None
    if name in ("mul", "truediv", "div") or n.target in (operator.mul, operator.truediv):
        constants = [a for a in n.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        tensors = [a for a in n.args if isinstance(a, torch.fx.Node)]
        if len(constants) == 1 and len(tensors) == 1 and _reads_matmul(tensors[0]):
            c = float(constants[0])
            return c if name == "mul" or n.target is operator.mul else (1.0 / c if c else None)
    return None


def _reads_matmul(n: torch.fx.Node) -> bool:
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name in ("matmul", "bmm", "einsum", "baddbmm")


def _scale_hints(reference: Any, ref_node: torch.fx.Node, candidate: Any,
                 cand_node: torch.fx.Node) -> list[str]:
    ref_scales = attention_scales(reference, ref_node)
    cand_scales = attention_scales(candidate, cand_node)
    if len(ref_scales) == 1 and len(cand_scales) == 1 and not math.isclose(
            next(iter(ref_scales)), next(iter(cand_scales)), rel_tol=1e-6):
        r, c = next(iter(ref_scales)), next(iter(cand_scales))
        return [f"attention scale differs: the reference multiplies q·kᵀ by {r:.6g} "
                f"(1/sqrt({1 / r**2:.4g})), the candidate by {c:.6g} (1/sqrt({1 / c**2:.4g}))"]
    return []


def _mask_hints(snapshot: Any | None, padded_rows: Sequence[bool], found: list[str]) -> list[str]:
    if snapshot is None or found or not any(padded_rows) or all(padded_rows):
        return []
    rows = snapshot.row_errors
    if len(rows) != len(padded_rows):
        return []
    clean = max((e for e, p in zip(rows, padded_rows, strict=True) if not p), default=0.0)
    dirty = max((e for e, p in zip(rows, padded_rows, strict=True) if p), default=0.0)
    if dirty > 0.0 and clean <= dirty * 1e-3:  # the unpadded rows agree (up to rounding)
        return [f"errors only in the padded sequences of the batch (up to {dirty:.3g}), none "
                "in the unpadded ones: the attention mask differs (its value, e.g. -10000 "
                "against the dtype's minimum, its sign, or which positions it hides)"]
    return []


def _dtype_hints(reference: Any, pair: Pair, candidate: Any, noise_budget: bool) -> list[str]:
    ref_dtype = next((r.dtype for r in reference.records if r.name == pair.reference), "")
    cand_dtype = next((r.dtype for r in candidate.records if r.name == pair.candidate), "")
    if noise_budget and ref_dtype and cand_dtype and cand_dtype != "float64":
        return []  # the budget is already this node's own rounding noise: not rounding
    if ref_dtype and cand_dtype and ref_dtype != cand_dtype:
        return [f"the candidate computes in {cand_dtype} and the reference in {ref_dtype}: "
                f"{ROUNDING} the default budget; measure each node's own "
                "noise with noise_budget=True (--noise-budget)"]
    return []


__all__ = ["ROUNDING", "attention_scales", "explain"]
