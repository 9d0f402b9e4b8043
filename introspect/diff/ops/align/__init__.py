"""Align two traced graphs node by node, without trusting names or positions.

shared/DESIGN.md, "Aligning two graphs": a node that reads weights corresponds to the
node of the other graph that reads the same weights, and the nodes between such anchors
correspond when they do the same kind of thing to corresponding inputs. In order:

1. **Weights** (``weights``): every weight the candidate reads is related to the
   reference's by value (same, transposed, a slice, a fusion), or by name as a last
   resort. Equal values read by several nodes (LayerNorm weights at initialisation) are
   left to the next steps unless the names settle them.
2. **Anchors** (``matcher``): nodes that read related weights are paired; a slice or a
   fusion becomes a pair on a region of the output's last dimension, and the nodes that
   cut a fused output apart (``split``, ``chunk``, ``[..., a:b]``) pair with the parts.
3. **Structure, forward** (``propagate``): a node pairs with the first unpaired node of
   the same kind and shape whose inputs are the partners of its own inputs.
4. **Consumers, backward** (``propagate``): the arguments of a paired node pair with the
   same arguments of its partner, through chains of layout ops aligned by shape.
   Steps 3 and 4 repeat until nothing changes.
5. **Leftovers** (``leftovers``): every node left over gets a reason, naming the compared
   node its effect reaches.

No step pairs two nodes by position alone: weights, inputs or consumers always decide.

Example::

    >>> alignment = align_graphs(reference_graph, candidate_graph)
    >>> alignment.pairs[0]
    Pair(reference='input_ids', candidate='input_ids', matched_by='input', ...)
    >>> alignment.coverage
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from introspect.diff.ops.align.leftovers import leftovers
from introspect.diff.ops.align.matcher import Matcher
from introspect.diff.ops.align.propagate import backward, forward
from introspect.diff.ops.align.view import GraphView
from introspect.diff.ops.align.weights import describe_order, relate_weights, unique_weights
from introspect.diff.records import Pair, Unmatched, WeightRelation
from introspect.errors import InputError

# Below this share of weighted reference nodes paired, the models are not the same kind.
_MIN_WEIGHT_COVERAGE = 0.5
# ... unless this share of the candidate's recorded weights (by values) are the reference's
_SEEN_RELATED = 0.9


@dataclass
class Alignment:
    """Which node of the candidate computes what node of the reference, and what is left.

    Attributes:
        pairs: aligned pairs, in the reference's graph order (several pairs may share a
            reference node: one per head of a per-head candidate).
        unmatched: tensor nodes of either graph with no counterpart, with the reason.
        skipped: nodes not compared at all (shape bookkeeping, constants), with the reason.
        relations: how each of the candidate's weights relates to the reference's.
        notes: what a user should know (an output with no counterpart, name fallbacks).
    """

    pairs: list[Pair]
    unmatched: list[Unmatched]
    skipped: list[Unmatched]
    relations: list[WeightRelation]
    notes: list[str] = field(default_factory=list)
    reference_tensor_nodes: int = 0

    @property
    def coverage(self) -> float:
        """Share of the reference's tensor nodes that are paired."""
        paired = {p.reference for p in self.pairs}
        return len(paired) / self.reference_tensor_nodes if self.reference_tensor_nodes else 1.0

    def pairs_of(self, side: str, name: str) -> list[Pair]:
        """The pairs that hold node ``name`` of ``side`` ("reference" or "candidate")."""
        return [p for p in self.pairs if getattr(p, side) == name]



def align_graphs(reference: Any, candidate: Any, *, name_map: Mapping[str, str] | None = None,
                 ) -> Alignment:
    """Pair the nodes of two traced graphs (``IntrospectGraph``) that compute the same values.

    Args:
        reference: the reference's ``IntrospectGraph`` (its ``gm`` and ``records``).
        candidate: the candidate's ``IntrospectGraph``.
        name_map: optional help: candidate node name -> reference node name (pairs them
            outright), or candidate parameter/module path prefix -> reference prefix
            (settles weights that do not relate by value, or relate to several).

    Returns:
        An ``Alignment``: pairs, nodes without counterpart (with reasons), skipped nodes,
        and how each candidate weight relates to the reference's.

    Raises:
        InputError: the two models do not implement the same model: no output in common,
            or fewer than half of the reference's weighted nodes find a counterpart while
            the weights the candidate's recording saw are not the reference's either.

    Example::

        >>> alignment = align_graphs(introspect.trace(hf, inputs), introspect.trace(port, inputs))
        >>> query = "encoder_layer_0_attention_self_query"
        >>> [p.candidate for p in alignment.pairs_of("reference", query)]
        ['encoder_layer_0_attention_self_qkv']
    """
    name_map = dict(name_map or {})
    ref = GraphView(reference.gm, reference.records, "reference")
    node_map = {k: v for k, v in name_map.items() if k in {r.name for r in candidate.records}}
    prefix_map = {k: v for k, v in name_map.items() if k not in node_map}
    cand = GraphView(candidate.gm, candidate.records, "candidate", prefix_map)
    for c_name, r_name in node_map.items():
        if r_name not in ref.nodes:
            raise InputError(f"name_map maps {c_name!r} to {r_name!r}, which is no node of the "
                             "reference; use names from the reference's graph.nodes['name']")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # comparing weights reads memory once: threads only wait
    try:
        relations = relate_weights(ref, cand)
    finally:
        torch.set_num_threads(threads)
    matcher = Matcher(ref, cand, relations)
    for c_name, r_name in node_map.items():
        matcher.add(Pair(r_name, c_name, "name map"))
    matcher.inputs()
    matcher.anchors()
    matcher.biases_apart()
    partial = _check_same_model(matcher)
    notes = matcher.outputs()
    for _ in range(8):
        if not (forward(matcher) | backward(matcher)):
            break
    unmatched, skipped = leftovers(matcher)
    pairs = sorted(matcher.pairs, key=lambda p: (ref.order[p.reference], cand.order[p.candidate]))
    flat = [r for found in relations.values() for r in found]
    by_name = [r for r in flat if r.kind.startswith("by-name") and r.max_abs_diff > 0]
    if by_name:
        notes.append(f"{len(by_name)} candidate weight(s) relate to the reference's by name only, "
                     f"with other values: {', '.join(r.candidate for r in by_name[:4])}"
                     f"{' ...' if len(by_name) > 4 else ''}")
    notes += _relation_notes(flat, pairs)
    notes += [partial] if partial else []
    tensors = sum(1 for name in ref.nodes if ref.compared(name))
    return Alignment(pairs, unmatched, skipped, flat, notes, tensors)


def _relation_notes(relations: list[WeightRelation], pairs: list[Pair]) -> list[str]:
    """The relations other than equal, transposed, sliced or fused, named in the notes."""
    groups: dict[str, list[str]] = {}
    for r in relations:
        if r.kind == "permuted" and r.order is not None:
            groups.setdefault(f"the reference's with its {describe_order(r.order)}", []).append(
                r.candidate)
        elif r.kind.endswith("reshaped"):
            groups.setdefault(f"the reference's {r.kind}", []).append(r.candidate)
        elif r.kind.startswith("quantized"):
            to = "float16" if "float16" in r.kind else "int8"
            groups.setdefault(f"the reference's quantized to {to} (each element within one "
                              f"quantization step; their nodes get {to}'s budget)",
                              []).append(r.candidate)
    notes = [f"{len(found)} candidate weight(s) are {what}: {', '.join(found[:4])}"
             f"{' ...' if len(found) > 4 else ''}" for what, found in groups.items()]
    notes += list(dict.fromkeys(p.note for p in pairs if "offset embedding table" in p.note))
    return notes


def _check_same_model(matcher: Matcher) -> str:
    """Refuse two models that are not the same kind: fewer than half of the reference's
    weighted nodes paired, while the candidate's recorded weights do not hold the
    reference's either. Where they do (``_SEEN_RELATED`` of their values), the recording
    saw only part of the candidate's computation (a region in another thread, in NumPy,
    under ``vmap``): the pairs it has stand, and a note says so."""
    weighted = [r for r, found in matcher.ref.weights.items()
                if matcher.ref.compared(r) and any(t.ndim >= 2 for _, t in found)]
    if not weighted:
        return ""
    anchored = sum(1 for r in weighted if r in matcher.ref_paired)
    if anchored / len(weighted) >= _MIN_WEIGHT_COVERAGE:
        return ""
    cand_weights = unique_weights(matcher.cand)
    cand_params = sum(t.numel() for t in cand_weights.values())
    related = sum(t.numel() for label, t in cand_weights.items()
                  if any(not r.kind.startswith("by-name")  # (a name proves no value)
                         for r in matcher.relations.get(label, ())))
    if cand_params and related >= _SEEN_RELATED * cand_params:
        return (f"the candidate's recording paired {anchored} of the reference's {len(weighted)} "
                "weighted nodes, though the weights it saw are the reference's: the rest it "
                "computes in a way no recorded node pairs with (for example its rows one at a "
                "time, in another thread, NumPy, TorchScript or vmap); there, module evidence "
                "and the outputs judge")
    if not cand_params:  # (not another model: none of its weights was read where seen)
        raise InputError(
            "the candidate's recording saw none of its weights: it reads them where the "
            "recording does not reach (another thread, NumPy, TorchScript, vmap)")
    ref_params = sum(t.numel() for t in unique_weights(matcher.ref).values())
    raise InputError(
        f"the candidate shares weights with only {anchored} of {len(weighted)} weighted "
        f"nodes ({ref_params:,} vs {cand_params:,} weights): another model or size, or "
        "not loaded from the reference? pass name_map"
    )


__all__ = ["Alignment", "align_graphs", "relate_weights"]
