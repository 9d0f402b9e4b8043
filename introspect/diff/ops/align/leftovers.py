"""Step 5 of alignment: every node left without a counterpart gets a reason.

The reason names the compared node its effect reaches ("layout only (view); its values
are compared at ..."), so a reader of the table knows where its error is accounted for.
"""

from __future__ import annotations

from introspect.diff.ops.align.matcher import Matcher
from introspect.diff.ops.align.view import GraphView, first_reached
from introspect.diff.records import STATUS_SKIPPED, Unmatched
from introspect.tracing.records import KIND_MULTI, KIND_OTHER, KIND_SHAPE


# -- step 5: reasons ------------------------------------------------------------------
def leftovers(m: Matcher) -> tuple[list[Unmatched], list[Unmatched]]:
    unmatched: list[Unmatched] = []
    skipped: list[Unmatched] = []
    for graph, other, paired in ((m.ref, "candidate", m.ref_paired),
                                 (m.cand, "reference", m.cand_paired)):
        for name in sorted(graph.nodes, key=lambda n: graph.order.get(n, -1)):
            node, record = graph.nodes[name], graph.records.get(name)
            if name in paired or record is None or node.op == "output":
                continue
            if record.kind in (KIND_SHAPE, KIND_OTHER):
                skipped.append(Unmatched(graph.side, name, "shape bookkeeping"
                                         if record.kind == KIND_SHAPE else "not a tensor",
                                         STATUS_SKIPPED))
            elif name not in graph.data_dependent:
                skipped.append(Unmatched(graph.side, name, "constant (weight, buffer or "
                                         "tensor constant): checked through the nodes "
                                         "that read it", STATUS_SKIPPED))
            else:
                unmatched.append(Unmatched(graph.side, name, _reason(m, graph, name, other)))
    return unmatched, skipped


def _reason(m: Matcher, graph: GraphView, name: str, other: str) -> str:
    paired = m.ref_paired if graph is m.ref else m.cand_paired
    if name in m.superseded:
        return (f"computes part of a weighted op whose complete result is "
                f"{m.superseded[name]}; compared there")
    if graph.records[name].kind == KIND_MULTI:
        return "a tuple of tensors; its items are compared"
    reached = first_reached(graph, name, paired)
    op = graph.records[name].op_type
    if reached is None:
        return f"no counterpart in the {other}, and nothing compared depends on it"
    if graph.kinds[name] == "dropout":
        return f"dropout, the identity in eval mode; its values are compared at {reached}"
    if graph.kinds[name] == "cast":
        return f"a cast ({op}); its values are compared at {reached}"
    if graph.transparent(name):
        return f"layout only ({op}); its values are compared at {reached}"
    side = "candidate" if graph is m.ref else "reference"
    partners = pairs_with(m, side, reached)
    other_graph = m.cand if graph is m.ref else m.ref
    fused = [p for p in partners if other_graph.kinds.get(p) == "attention"]
    if fused:
        return (f"computed inside the {other}'s scaled_dot_product_attention ({fused[0]}); "
                f"compared at {reached}")
    return (f"the {other} computes this another way ({op} has no counterpart); "
            f"compared at {reached}")


def pairs_with(m: Matcher, side: str, name: str) -> list[str]:
    if side == "candidate":
        return [p.candidate for p in m.pairs if p.reference == name]
    return [p.reference for p in m.pairs if p.candidate == name]



__all__ = ["leftovers"]
