"""Steps 3 and 4 of alignment: pairs spread from the anchors along the data flow.

- **Structure, forward** (in the reference's graph order): a node pairs with the first
  unpaired candidate node of the same kind and shape whose inputs are the partners of
  its own inputs (looking through layout ops, dropout and casts).
- **Consumers, backward**: the arguments of a paired node pair with the same arguments
  of its partner; where one side reaches the argument through more layout ops than the
  other, the chains are aligned by shape, and the sources of two chains pair when they
  hold the same number of elements (compared by value after a reshape or permute).
"""

from __future__ import annotations

from typing import Any

from introspect.diff.ops.align.matcher import Matcher
from introspect.diff.ops.align.view import COMMUTATIVE, GraphView, numel
from introspect.diff.records import BY_CONSUMER, BY_STRUCTURE, Pair
from introspect.tracing.records import KIND_TENSOR


# -- step 3: structure, forward -------------------------------------------------------
def forward(m: Matcher) -> bool:
    changed = False
    by_kind: dict[tuple[str, Any, str], list[str]] = {}
    for c in sorted(m.cand.nodes, key=lambda n: m.cand.order.get(n, -1)):
        if m.cand.compared(c) and c not in m.cand_paired:
            by_kind.setdefault(_kind_key(m.cand, c), []).append(c)
    for r in sorted(m.ref.nodes, key=lambda n: m.ref.order.get(n, -1)):
        if not m.ref.compared(r) or r in m.ref_paired:
            continue
        options = by_kind.get(_kind_key(m.ref, r), [])
        for c in options:
            if c not in m.cand_paired and _consistent(m, r, c):
                m.add(Pair(r, c, BY_STRUCTURE))
                changed = True
                break
    return changed


def _kind_key(graph: GraphView, name: str) -> tuple[str, Any, str]:
    return graph.kinds[name], graph.shape(name), graph.value_kind(name)


def _consistent(m: Matcher, r: str, c: str) -> bool:
    ref_inputs, cand_inputs = m.ref.data_inputs(r), m.cand.data_inputs(c)
    if len(ref_inputs) != len(cand_inputs):
        return False
    if not ref_inputs:  # nothing to anchor it (an arange): left to its consumers
        return False
    orders = [cand_inputs]
    if m.ref.kinds[r] in COMMUTATIVE and len(cand_inputs) == 2:
        orders.append(cand_inputs[::-1])
    return any(all(_source(m, m.cand, ci) in
                   m.ref_partners.get(_source(m, m.ref, ri), ())
                   for ri, ci in zip(ref_inputs, order, strict=True)) for order in orders)


def _source(m: Matcher, graph: GraphView, name: str) -> str:
    """Follow unpaired layout ops, dropout and casts back to the node that made the data."""
    partners = m.ref_partners if graph is m.ref else m.cand_partners
    while name not in partners and graph.transparent(name):
        inputs = graph.data_inputs(name)
        if len(inputs) != 1:
            break
        name = inputs[0]
    return name


# -- step 4: consumers, backward -------------------------------------------------------
def backward(m: Matcher) -> bool:
    changed = False
    for pair in sorted(m.pairs, key=lambda p: -m.ref.order[p.reference]):
        if pair.reference_region is not None or pair.candidate_region is not None \
                or (pair.reference, pair.candidate) in m.own_arguments:
            continue
        for ri, ci in _argument_pairs(m, pair.reference, pair.candidate):
            changed |= _pair_chains(m, ri, ci)
    return changed


def _argument_pairs(m: Matcher, r: str, c: str) -> list[tuple[str, str]]:
    """The arguments of a pair that hold the same quantities, argument by argument.

    Two nodes of different kinds share no argument by position (a LayerNorm's input is
    not the input of the ``x̂·γ`` inside a hand-written one), except two weighted ops that
    read the same weights (a Linear and an einsum) whose data input is the same.
    The two terms of a sum or a product pair only when one of them is known to pair:
    ``word + token_type`` and ``word + position`` are not the same quantity, and which
    operand comes first says nothing.
    """
    if m.ref.kinds[r] != m.cand.kinds[c]:  # a bias added after the matmul holds the result:
        r, c = _weighted_op(m, m.ref, r), _weighted_op(m, m.cand, c)  # its input is the matmul's
    ref_inputs, cand_inputs = m.ref.data_inputs(r), m.cand.data_inputs(c)
    if len(ref_inputs) != len(cand_inputs):
        return []
    if m.ref.kinds[r] != m.cand.kinds[c] and not (
            len(ref_inputs) == 1 and _reads_matrix(m.ref, r) and _reads_matrix(m.cand, c)):
        return []
    if m.ref.kinds[r] in COMMUTATIVE and len(ref_inputs) == 2:
        ref_sources = [_source(m, m.ref, i) for i in ref_inputs]
        cand_sources = [_source(m, m.cand, i) for i in cand_inputs]

        def confirmed(order: list[str]) -> bool:
            together = list(zip(ref_sources, order, strict=True))
            known = [cs in m.ref_partners.get(rs, ()) for rs, cs in together]
            contradicted = [not k and bool(m.ref_partners.get(rs) or m.cand_partners.get(cs))
                            for k, (rs, cs) in zip(known, together, strict=True)]
            return any(known) and not any(contradicted)

        if confirmed(cand_sources):
            pass
        elif confirmed(cand_sources[::-1]):
            cand_inputs = cand_inputs[::-1]
        else:
            return []
    return list(zip(ref_inputs, cand_inputs, strict=True))


def _weighted_op(m: Matcher, graph: GraphView, name: str) -> str:
    """The node that reads the matrix of the weighted op whose result ``name`` holds."""
    if graph is not m.cand or _reads_matrix(graph, name):
        return name
    earlier = [n for n, later in m.superseded.items() if later == name and _reads_matrix(graph, n)]
    return earlier[0] if len(earlier) == 1 else name


def _reads_matrix(graph: GraphView, name: str) -> bool:
    return any(t.ndim >= 2 for _, t in graph.weights.get(name, ()))


def _chain(m: Matcher, graph: GraphView, name: str, paired: set[str]) -> list[str]:
    chain = [name]
    while chain[-1] not in paired and graph.transparent(chain[-1]):
        inputs = graph.data_inputs(chain[-1])
        if len(inputs) != 1:
            break
        chain.append(inputs[0])
    return chain


def _pair_chains(m: Matcher, ri: str, ci: str) -> bool:
    ref_chain = _chain(m, m.ref, ri, m.ref_paired)
    cand_chain = _chain(m, m.cand, ci, m.cand_paired)
    changed = False
    for r, c in _best_chain_pairs(m, ref_chain, cand_chain):
        m.add(Pair(r, c, BY_CONSUMER))
        changed = True
    r, c = ref_chain[-1], cand_chain[-1]
    if m.free(r, c) and not m.ref.transparent(r) and not m.cand.transparent(c) \
            and m.same_value_kind(r, c) and numel(m.ref.shape(r)) == \
            numel(m.cand.shape(c)) and m.ref.records[r].kind == KIND_TENSOR \
            and m.cand.records[c].kind == KIND_TENSOR:
        m.add(Pair(r, c, BY_CONSUMER, "layout: the candidate's value is reshaped or "
                                      "permuted to the reference's shape"))
        changed = True
    return changed


def _best_chain_pairs(m: Matcher, ref_chain: list[str],
                      cand_chain: list[str]) -> list[tuple[str, str]]:
    """Pairs along two chains of layout ops, in order, with equal shapes (weighted LCS)."""
    n, k = len(ref_chain), len(cand_chain)
    score = [[0.0] * (k + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(k - 1, -1, -1):
            best = max(score[i + 1][j], score[i][j + 1])
            gain = _chain_gain(m, ref_chain[i], cand_chain[j])
            if gain > 0:
                best = max(best, gain + score[i + 1][j + 1])
            score[i][j] = best
    pairs, i, j = [], 0, 0
    while i < n and j < k:
        gain = _chain_gain(m, ref_chain[i], cand_chain[j])
        if gain > 0 and score[i][j] == gain + score[i + 1][j + 1]:
            pairs.append((ref_chain[i], cand_chain[j]))
            i, j = i + 1, j + 1
        elif score[i][j] == score[i + 1][j]:
            i += 1
        else:
            j += 1
    return pairs


def _chain_gain(m: Matcher, r: str, c: str) -> float:
    if not m.free(r, c) or m.ref.shape(r) != m.cand.shape(c) \
            or not m.same_value_kind(r, c):
        return 0.0
    gain = 1.0
    if m.ref.kinds[r] == m.cand.kinds[c]:
        gain += 0.5
    if m.ref.transparent(r) == m.cand.transparent(c):
        gain += 0.25
    return gain



__all__ = ["backward", "forward"]
