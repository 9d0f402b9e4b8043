"""The first divergence: where the candidate starts computing something else, and why.

A pair whose local error is over budget is only a *candidate* for the first divergence.
It is confirmed when the candidate's own value differs there too and the difference
reaches a later compared node or an output; otherwise the two nodes were not the same
quantity (terms of a sum regrouped, a mis-pair) or the difference vanishes, and the row
is marked ``unconfirmed`` with the reason, never blamed. A pair that no weight, name or
value proves (a guess: ``NodeDiff.provenance`` "structure") fails only where the nearest
proven pairs or the outputs it feeds disagree.

When the confirmed node only moves data (view, transpose, contiguous, dropout, an item
of a split), the blame goes to the op that computed the values: the first node up the
chain of layout ops on each side, with the chain in ``Divergence.detail``.

NaN or Inf in any compared value fails the diff (unless allowed) and the first node
that holds them is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch

from introspect.diff.hypotheses.hints import ROUNDING, explain
from introspect.diff.hypotheses.pooler import UNDER_THE_HEAD
from introspect.diff.modules.paths import layer_at, moved_to, within
from introspect.diff.ops.align import Alignment
from introspect.diff.ops.align.matcher import BY_NAME_NOTE
from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.records import RunResult
from introspect.diff.ops.outside import handed_values, outside_hint
from introspect.diff.records import (
    PROVEN_STRUCTURE,
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_UNCONFIRMED,
    WEIGHT_EDIT,
    Divergence,
    NodeDiff,
    Pair,
)
from introspect.diff.tolerance import Budget
from introspect.graph import IntrospectGraph

# Ops that move or select data without computing: a divergence there is blamed upstream.
_MOVES = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten",
          "squeeze", "unsqueeze", "t", "clone", "expand", "expand_as", "view_as", "reshape_as",
          "movedim", "swapaxes", "getitem", "split", "chunk", "unbind", "narrow", "Dropout",
          "dropout", "to", "type", "float", "type_as"}


def confirm_failures(rows: list[NodeDiff], reference: IntrospectGraph,
                     agreeing_outputs: Collection[str] = ()) -> list[NodeDiff]:
    """Rows with a local error over budget that nothing confirms become ``unconfirmed``.

    Confirmed: the candidate's own value is over budget at the node (propagated error),
    and the node is an output or feeds, through any path, a compared node whose own value
    is over budget too. A guess (``provenance`` "structure": paired by structure alone,
    one of several alike weights picked by position, an opaque op) needs more: walking
    down the data flow, the nearest proven pairs it reaches (weights, name, value) must
    include one over budget, or it must reach an output that disagrees. A proven pair
    within budget settles its branch: rounding carried through a deep model (drift far
    downstream) never confirms a guess, however deep. Every row is checked (no cap).
    Rows that fail on NaN or Inf stay failing. ``agreeing_outputs``: the reference's
    outputs (by name) that the truth runs compared and found within budget
    (``introspect.diff.outputs``): such an output cannot confirm a failure, even where no
    node-level pair holds it.
    """
    over = {r.reference_node for r in rows if r.status in (STATUS_FAIL, STATUS_DRIFT)
            and r.mismatched}
    outputs = {n.name for n in reference.gm.graph.nodes
               if any(u.op == "output" for u in n.users)}
    compared = {r.reference_node for r in rows if r.candidate_node and r.max_abs_err is not None}
    agreeing: set[str] = set()
    if agreeing_outputs:
        returned: Any = next((n.args[0] for n in reference.gm.graph.nodes
                              if n.op == "output"), {})
        if isinstance(returned, dict):
            agreeing = {getattr(node, "name", "") for name, node in returned.items()
                        if name in agreeing_outputs}
            compared |= agreeing - over
    unseen_outputs = outputs - compared  # not compared: they may differ, so the benefit
    # of the doubt goes to the failure
    # A guess is confirmed by the nearest proven pairs it feeds: one over budget there
    # (or an output that disagrees, or one not compared) confirms it; where they all agree,
    # the difference it shows is its own pairing's, not the candidate's.
    proven: dict[str, bool] = {}
    widths: dict[str, float] = {}  # each proven pair's budget (the widest of its rows)
    for r in rows:
        if r.candidate_node and r.max_abs_err is not None and not is_guess(r):
            # (its own row's: a guess beside it, over budget, says nothing of it)
            proven[r.reference_node] = proven.get(r.reference_node, False) or bool(
                r.status in (STATUS_FAIL, STATUS_DRIFT) and r.mismatched)
            widths[r.reference_node] = max(widths.get(r.reference_node, 0.0), r.atol or 0.0)
    disagreeing = ((over & outputs) - agreeing) | unseen_outputs
    users = {n.name: [u.name for u in n.users] for n in reference.gm.graph.nodes}
    inputs = {n.name: [i.name for i in n.all_input_nodes] for n in reference.gm.graph.nodes}
    carried = {r.reference_node: r.max_abs_err or 0.0 for r in rows
               if r.reference_node in proven}  # each proven pair's propagated error
    reaches = _reaching(reference, over | unseen_outputs)
    confirmed: list[NodeDiff] = []
    for row in rows:
        if row.status != STATUS_FAIL or (row.nonfinite or 0) > 0:
            confirmed.append(row)
            continue
        if is_guess(row):
            reason = _guess_reason(row, proven, disagreeing, users, widths)
            settled = _settled_by(row, proven, users, widths) if reason else None
            if reason and settled is not None and (row.max_abs_err or 0.0) > REFUTED * settled:
                reason += (f"; the proven pairs it feeds agree within {settled:.2g}: a "
                           f"difference of {row.max_abs_err:.2g} here does not reach them (it "
                           "pairs another quantity, or one whose difference cancels, as "
                           "rotary positions shifted alike)")
            elif reason and _grown_across(row, carried, users, inputs):
                # the values changed inside the guess's region: confirmed, unless module
                # evidence passes the module that holds it (``overruled_inside``)
                reason = ""
                row = dataclasses.replace(row, note="; ".join(
                    n for n in (row.note, GROWN_NOTE) if n))
        else:
            reason = _unconfirmed_reason(row, reaches, outputs)
        if reason:
            note = f"{row.note}; {reason}" if row.note else reason
            row = dataclasses.replace(row, status=STATUS_UNCONFIRMED, note=note)
        confirmed.append(row)
    return confirmed


def confirmed_inside(rows: Sequence[NodeDiff], modules: Collection[str]) -> list[NodeDiff]:
    """The rows with each unconfirmed guess over budget inside one of the reference's
    ``modules`` failing again: module evidence (the candidate's module, run on the
    reference's inputs to it, over its own budget) proves the fault is in there, and the
    guess names where inside."""
    return [dataclasses.replace(r, status=STATUS_FAIL, note=_confirmed_note(r.note))
            if r.status == STATUS_UNCONFIRMED and is_guess(r) and r.mismatched
            and any(within(r.module, m) for m in modules) else r for r in rows]


def overruled_inside(rows: Sequence[NodeDiff], passing: Collection[str],
                     candidate_module: Mapping[str, str]) -> list[NodeDiff]:
    """The rows failing on a guess (``on_a_guess``) unconfirmed again where their
    candidate node sits inside one of the candidate's modules in ``passing``: module
    evidence ran that module on the reference's own inputs to it and found the
    reference's output within budget. So the growth is rounding of another grouping
    (1/sqrt(d) folded into the query weights), and weights paired by their names that
    hold other values are compensated in that module (a norm's gain and shift folded
    into the Linear after it), not a fault. No FAIL stands on a guess that the evidence
    around it contradicts. ``candidate_module``: each candidate node's module path."""
    def overruled(note: str) -> str:
        parts = note.split("; ")
        said = OVERRULED_NOTE if GROWN_NOTE in parts else BY_NAME_OVERRULED_NOTE
        return "; ".join([*(part for part in parts if part != GROWN_NOTE), said])

    return [dataclasses.replace(r, status=STATUS_UNCONFIRMED, note=overruled(r.note))
            if on_a_guess(r) and _in_any(r.candidate_node, passing, candidate_module)
            else r for r in rows]


def on_a_guess(row: NodeDiff) -> bool:
    """A failing row that stands on a guess: confirmed only by the growth of the error
    around it (``GROWN_NOTE``), or paired by the names of weights that hold other values
    (``align.matcher.BY_NAME_NOTE``)."""
    parts = row.note.split("; ")  # (where NaN or inf first appear the row is judged by
    return row.status == STATUS_FAIL and not row.nonfinite and (  # them: no guess)
        GROWN_NOTE in parts or any(p.startswith(BY_NAME_NOTE) for p in parts))


def cancelled_inside(rows: Sequence[NodeDiff], cancelled: Collection[str],
                     candidate_module: Mapping[str, str],
                     cancelled_rows: Collection[tuple[str, str]] = ()) -> list[NodeDiff]:
    """The failing rows unconfirmed where their candidate node sits inside one of the
    candidate's modules in ``cancelled``: module evidence found the module holding that
    one the reference's exactly in float64 (``modules.cancelled``), so what the node
    differs by (a key's bias) cancels there and changes nothing the model computes. So
    are the rows in ``cancelled_rows`` (by reference node, candidate node): a module
    holding both their nodes found so (``cancelled.cancelling_holders``)."""
    return [dataclasses.replace(r, status=STATUS_UNCONFIRMED,
                                note="; ".join(p for p in (r.note, CANCELLED_NOTE) if p))
            if r.status == STATUS_FAIL and (
                _in_any(r.candidate_node, cancelled, candidate_module)
                or (r.reference_node, r.candidate_node) in cancelled_rows)
            else r for r in rows]


def _in_any(node: str, modules: Collection[str], candidate_module: Mapping[str, str]) -> bool:
    """Candidate node ``node`` runs inside one of the candidate's named ``modules``."""
    module = candidate_module.get(node)
    return module is not None and any(within(module, m) for m in modules if m)


def _confirmed_note(note: str) -> str:
    kept = [part for part in note.split("; ") if not part.startswith("unconfirmed:")]
    return "; ".join([*kept, "confirmed by module evidence: its module fails on its own"])


def is_guess(row: NodeDiff) -> bool:
    """Whether no weight, name or value proves that the row's two nodes hold one quantity."""
    return row.provenance == PROVEN_STRUCTURE


def _reaching(reference: IntrospectGraph, targets: set[str]) -> set[str]:
    """The nodes from which some node of ``targets`` is reached along the data flow (a
    user of a user ...), found in one pass backwards over the graph: every failing row is
    then checked at once, however deep the model."""
    found: set[str] = set()
    for node in reversed(list(reference.gm.graph.nodes)):
        if any(u.name in targets or u.name in found for u in node.users):
            found.add(node.name)
    return found


def _guess_reason(row: NodeDiff, proven: Mapping[str, bool], disagreeing: set[str],
                  users: Mapping[str, list[str]], widths: Mapping[str, float]) -> str:
    """Why a guessed pair over budget is not blamed, or "" when what it feeds confirms it.

    The search runs down the data flow and stops at each proven pair it meets: a proven
    pair over budget, or an output that disagrees, confirms the guess; a proven pair
    within budget shows the candidate's values are right there, where its budget is no
    wider than the guess's own. A wider one (an int8 Linear's, a TF32 matmul's) lets a
    float-sized difference through unseen: the search goes on past it.
    """
    if not row.mismatched:
        return ("unconfirmed: the local error is over budget but the candidate's own value "
                "agrees here; the two nodes hold different quantities, not a bug")
    if row.reference_node in disagreeing:
        return ""
    atol = (row.atol or 0.0) * 1.001
    # (a proven pair that agrees within a budget no wider than the guess's settles its
    # branch: the values agree again there)
    for user in _flow(row.reference_node, users,
                      lambda u: u not in proven or widths.get(u, 0.0) > atol):
        if user in proven and not proven[user] and widths.get(user, 0.0) <= atol:
            continue  # settled
        if proven.get(user) or user in disagreeing:
            return ""
    return ("unconfirmed: paired by structure only (no weight or value proves the two hold "
            "the same quantity), and its difference reaches no output or proven pair that "
            "disagrees")


# A guess whose own error is this many times the budgets of the agreeing proven pairs it
# feeds (and no disagreeing one) holds another quantity than its partner: a difference
# that large would show there (a Llama's RMSNorm in float64 paired a cast with the
# reference's ``x * rsqrt``: 1.81 against pairs agreeing within 1e-5).
REFUTED = 1000.0


def _settled_by(row: NodeDiff, proven: Mapping[str, bool], users: Mapping[str, list[str]],
                widths: Mapping[str, float]) -> float | None:
    """The widest budget of the proven pairs nearest down the data flow from ``row``,
    where every one of them agrees (None where one disagrees, or none is reached)."""
    found = []
    for user in _flow(row.reference_node, users, lambda u: u not in proven):
        if user in proven:
            if proven[user]:
                return None
            found.append(widths.get(user, 0.0))
    return max(found) if found and max(found) > 0 else None


def _flow(start: str, users: Mapping[str, list[str]], onward: Any) -> Iterator[str]:
    """The nodes down the data flow from ``start``, each once, nearest first; the walk goes
    on past a node only where ``onward(node)``."""
    seen, frontier = {start}, [start]
    while frontier:
        nxt = []
        for name in frontier:
            for user in users.get(name, ()):
                if user not in seen:
                    seen.add(user)
                    yield user
                    if onward(user):
                        nxt.append(user)
        frontier = nxt


# How much the error carried in may grow across a guessed region before the growth says
# the region computes something else. Measured on bert-tiny: a LayerNorm's eps of 1e-5 for
# 1e-12 behind a guess grew it 9.9x (4.8e-7 before, 4.7e-6 after); the deep Llama and the
# C++-op ports whose guesses pair the wrong partners carry 0 growth (bit-exact values).
GROWTH = 8.0
GROWN_NOTE = ("confirmed by growth: the nearest proven pairs after it carry over "
              f"{GROWTH:g}x the error of those before it")
CANCELLED_NOTE = ("unconfirmed: module evidence finds the module holding its module the "
                  "reference's exactly (float64): what it differs by cancels there")
BY_NAME_OVERRULED_NOTE = ("unconfirmed: its weights are the reference's by name only, with "
                          "other values, and module evidence passes the module that holds "
                          "it (its candidate run on the reference's inputs stays within "
                          "budget): what they differ by is made up for there (a norm's gain "
                          "folded into the Linear after it)")
OVERRULED_NOTE = ("unconfirmed: paired by structure only; the error grew across it, but "
                  "module evidence passes the module that holds it (its candidate run on "
                  "the reference's inputs stays within budget)")


def _grown_across(row: NodeDiff, carried: Mapping[str, float],
                  users: Mapping[str, list[str]], inputs: Mapping[str, list[str]]) -> bool:
    """Whether the nearest proven pairs after the guess carry an error over ``GROWTH``
    times the largest the nearest proven pairs before it carry, and over a quarter of the
    guess's budget: the candidate's values changed inside the region the guess sits in,
    whichever nodes it pairs."""
    after = _nearest(row.reference_node, carried, users)
    if not after:
        return False
    before = _nearest(row.reference_node, carried, inputs)
    if not before:  # nothing proven feeds it: no growth can be measured
        return False
    grown = max(after)
    return grown > GROWTH * max(before) and grown > 0.25 * (row.atol or 0.0)


def _nearest(start: str, carried: Mapping[str, float],
             edges: Mapping[str, list[str]]) -> list[float]:
    """The errors of the first proven pairs met walking ``edges`` from ``start``."""
    found, seen, frontier = [], {start}, [start]
    while frontier:
        nxt = []
        for name in frontier:
            for other in edges.get(name, ()):
                if other in seen:
                    continue
                seen.add(other)
                if other in carried:
                    found.append(carried[other])
                else:
                    nxt.append(other)
        frontier = nxt
    return found


def _unconfirmed_reason(row: NodeDiff, reaches: set[str], outputs: set[str]) -> str:
    if not row.mismatched:
        return ("unconfirmed: the local error is over budget but the candidate's own value "
                "agrees here; the two nodes hold different quantities (terms regrouped), "
                "not a bug")
    if row.reference_node in outputs or row.reference_node in reaches:
        return ""
    return ("unconfirmed: the difference reaches no later compared node and no output "
            "(it is undone later, or only padded positions differ)")


def first_divergence(rows: Sequence[NodeDiff], alignment: Alignment, run: RunResult,
                     reference: IntrospectGraph, candidate: IntrospectGraph,
                     padding: Padding, budgets: Sequence[Budget], *,
                     context: Mapping[str, Any] | None = None,
                     noise_budget: bool = False) -> Divergence | None:
    """The first failing row, blamed on the op that computed its values, with hints.

    Args:
        rows: the diff's rows, unconfirmed failures already marked.
        alignment, run, budgets: the alignment, the run's measurements and budgets.
        reference, candidate: the two traced graphs.
        padding: which positions are padding (for the mask hint).
        context: the models, the reference's inputs and the tolerance, for the hints
            tested on values (``introspect.diff.hypotheses``); None skips them.
        noise_budget: the budgets follow each node's measured noise.

    Returns:
        The ``Divergence``, or None when no row fails.
    """
    first = next((r for r in rows if r.status == STATUS_FAIL), None)
    if first is None:
        return None
    index = next(i for i, p in enumerate(alignment.pairs)
                 if p.reference == first.reference_node and p.candidate == first.candidate_node)
    pair = alignment.pairs[index]
    if first.nonfinite and not first.local_mismatched:
        stats = run.propagated[index]
        detail = (f"NaN or Inf first appear here: {stats.reference_nonfinite} value(s) in the "
                  f"reference, {stats.nonfinite} in the candidate")
        return Divergence(first.reference_node, first.candidate_node, first.module, first.layer,
                          first.op, float(first.local_max_abs_err or 0.0), str(budgets[index]),
                          (), detail)
    padded_rows = tuple(bool(x) for x in padding.padded.any(dim=1)) \
        if padding.padded is not None else ()
    snapshot = run.snapshots.get(index)
    hints = explain(pair, reference, candidate, alignment.relations, snapshot, padded_rows,
                    noise_budget=noise_budget)
    if context is not None and snapshot is not None:
        tested = _tested_hints(context, first, snapshot)
        hints = distinct_hints([*tested, *(h for h in hints if not tested or ROUNDING not in h)])
    if any(h.startswith(WEIGHT_EDIT) for h in hints):  # its forward moved them: not unloaded
        hints = tuple(h for h in hints if "left unloaded" not in h)
    dropout_seen = any(h.startswith("dropout is active") for h in hints)
    ref_node, cand_node, op, detail = _computing_op(first, reference, candidate,
                                                    keep_dropout=dropout_seen)
    ref_record = next(r for r in reference.records if r.name == ref_node)
    module, layer = ref_record.module, ref_record.layer or first.layer
    pooled = _pooler_module(reference) if layer == "head" \
        and any(UNDER_THE_HEAD in h for h in hints) else ""
    if pooled:  # a pooler bug the head shows (``hypotheses.pooler.head_hints``): the pooler
        module, layer = pooled, "pooler"
    if _computed_outside(candidate, cand_node):  # (no op of the candidate's computed it)
        op = ref_record.op_type
        hints = (outside_hint(module or layer, cand_node), *hints)
    if layer == "mask" and context is not None and snapshot is not None:
        module, layer = _where_positions_go(context, snapshot, reference) or (module, layer)
    cand_record = next((r for r in candidate.records if r.name == cand_node), None)
    later = _fed_from_a_later_layer(pair, layer, alignment, reference, candidate)
    if later is not None:  # the weights' values are another layer's: where it sits is later
        where = cand_record.module if cand_record and cand_record.module else cand_node
        hints = (f"the candidate's {where} reads the values of {layer}'s weights where it "
                 f"takes {later}'s values: a weight loaded from {layer} into {later}", *hints)
        # the same module of the later layer (``encoder.layer.3.output.dense``)
        module, layer = moved_to(module, layer, later), later
    skipped = _skipped_before(pair, layer, alignment, reference, candidate) \
        if later is None else None
    if skipped is not None:  # fed a value from before a layer of which nothing was found
        skipped_layer, fed_from = skipped
        hints = (f"no op of {skipped_layer} is found in the candidate, and its {layer} is "
                 f"handed what {fed_from} returns where the reference's is handed what "
                 f"{skipped_layer} returns: {skipped_layer} skipped", *hints)
        module, layer = _moved_layer(module, layer, skipped_layer), skipped_layer
    return Divergence(ref_node, cand_node, module, layer, op,
                      float(first.local_max_abs_err or 0.0), str(budgets[index]), hints,
                      detail, candidate_module=cand_record.module if cand_record else "")


def _pooler_module(reference: IntrospectGraph) -> str:
    """The reference's pooler module ("bert.pooler"), from its nodes' modules; "" for none."""
    for record in reference.records:
        if record.layer == "pooler" and record.module:
            parts = record.module.split(".")
            at = next((i for i, part in enumerate(parts) if part.startswith("pooler")), None)
            if at is not None:
                return ".".join(parts[:at + 1])
    return ""


def _skipped_before(pair: Pair, layer: str, alignment: Alignment,
                    reference: IntrospectGraph, candidate: IntrospectGraph,
                    ) -> tuple[str, str] | None:
    """(the first layer skipped, the layer the node's values come from), where every
    paired input of the candidate's node is from one layer before ``layer``'s block, and
    every block between the two has no paired node at all: the candidate never computes
    them (a loop started at 1, a block dropped from its list), and its ``layer`` is handed
    what the reference hands the first of them. None otherwise."""
    fed = _fed_by(pair, layer, alignment, reference, candidate)
    if fed is None:
        return None
    source, order, by_name = fed
    if order[source] >= order[layer]:
        return None
    between = [name for name, at in sorted(order.items(), key=lambda kv: kv[1])
               if order[source] < at < order[layer] and name not in _NOT_BLOCKS]
    found = {by_name[p.reference].layer for p in alignment.pairs if p.reference in by_name}
    if not between or any(name in found for name in between):
        return None
    return between[0], source


def _moved_layer(module: str, layer: str, other: str) -> str:
    """The module of layer ``other`` that ``layer``'s module sits in: ``encoder.layer.0``
    for ``encoder.layer.1.attention.self.query``; ``other`` where ``module`` is none of
    ``layer``'s."""
    at = layer_at(module, layer)
    return other if at is None else ".".join(module.split(".")[:at] + other.split("."))


def _fed_from_a_later_layer(pair: Pair, layer: str, alignment: Alignment,
                            reference: IntrospectGraph, candidate: IntrospectGraph,
                            ) -> str | None:
    """The reference layer every paired input of the candidate's node is from, where that
    layer comes after ``layer``, the one its pair names (paired by the values of the
    weights it reads). Values flow forward: a node reading layer 2's weights on layer 3's
    values sits in layer 3, and holds layer 2's weights by a loading slip (an off-by-one in
    a key mapping). None otherwise."""
    fed = _fed_by(pair, layer, alignment, reference, candidate, handed=True)
    if fed is None:
        return None
    later, order, by_name = fed
    if later == layer or later in _NOT_BLOCKS or order[later] <= order[layer]:
        return None
    # ... and the later layer's own module stands unread: a port running its layers out of
    # order also feeds an earlier layer a later one's values, each weight read where it is
    own = by_name.get(pair.reference)
    twin = moved_to(own.module, layer, later) if own is not None else later
    if any(by_name[p.reference].module == twin for p in alignment.pairs
           if p.reference in by_name):
        return None
    return later


def _fed_by(pair: Pair, layer: str, alignment: Alignment, reference: IntrospectGraph,
            candidate: IntrospectGraph, handed: bool = False,
            ) -> tuple[str, dict[str, int], dict[str, Any]] | None:
    """The one reference layer every paired input of the candidate's node is from, with
    the reference's layers in their order and its records by name; None where its inputs
    come from several layers or none, or ``layer`` is no block of a stack.

    ``handed``: an input is from the layer it is handed to, where the reference reads it
    only in one later layer than its own (a block's output, read by the next block alone):
    the first ops of a block take the values of that block, not of the one before it."""
    if layer in _NOT_BLOCKS:
        return None
    order: dict[str, int] = {}
    for record in reference.records:
        order.setdefault(record.layer, len(order))
    cand = next((r for r in candidate.records if r.name == pair.candidate), None)
    if cand is None or not cand.inputs or layer not in order:
        return None
    paired = {p.candidate: p.reference for p in alignment.pairs}
    by_name = {r.name: r for r in reference.records}
    readers = _reading_layers(reference) if handed else {}
    layers = {_handed_to(by_name[paired[name]], readers, order) for name in cand.inputs
              if paired.get(name) in by_name}
    if len(layers) != 1:
        return None
    (source,) = layers
    return (source, order, by_name) if source in order else None


def _reading_layers(reference: IntrospectGraph) -> dict[str, set[str]]:
    """Each reference node -> the layers of the nodes that read it."""
    readers: dict[str, set[str]] = {}
    for record in reference.records:
        for name in record.inputs:
            readers.setdefault(name, set()).add(record.layer)
    return readers


def _handed_to(record: Any, readers: Mapping[str, set[str]], order: Mapping[str, int]) -> str:
    """``record``'s layer, or the one later block that alone reads it (``_fed_by``)."""
    read = readers.get(record.name, set())
    if len(read) == 1:
        (reader,) = read
        if reader not in _NOT_BLOCKS and reader in order and record.layer in order \
                and order[reader] > order[record.layer]:
            return reader
    return record.layer


# the layers that are no block of a stack (``NodeRecord.layer``): a value read there after
# a block is no sign of weights loaded into the wrong block
_NOT_BLOCKS = frozenset({"", "inputs", "embeddings", "mask", "pooler", "head", "outputs"})


def distinct_hints(hints: Sequence[str]) -> tuple[str, ...]:
    """``hints`` without repeats: of two that name the same cause (the same words up to
    the first ':' or ';'), the first is kept (a tested hypothesis comes before a pattern)."""
    import re

    kept: dict[str, str] = {}
    for hint in hints:
        cause = re.split(r"[:;]", hint, maxsplit=1)[0].strip()
        kept.setdefault(cause, hint)
    return tuple(kept.values())


def _where_positions_go(context: Mapping[str, Any], snapshot: Any,
                        reference: IntrospectGraph) -> tuple[str, str] | None:
    """Positions (0, 1, 2, ...) made beside a decoder's mask belong where they are used:
    the module that takes them (GPT-2's ``wpe``, Llama's ``rotary_emb``) and its layer."""
    value = snapshot.reference_output
    if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dim() < 1:
        return None
    from introspect.diff.hypotheses.positions import position_consumer

    consumer = position_consumer(context["reference_model"], context["inputs"],
                                 value.shape[-1])
    module = consumer.split(" (")[0]
    layers = [r.layer for r in reference.records if r.module == module]
    return (module, layers[0]) if module and layers else None


def _computed_outside(candidate: IntrospectGraph, name: str) -> bool:
    """``name`` is a value the candidate's recording was handed from a thread or NumPy
    (``ops.outside``)."""
    node = next((n for n in candidate.gm.graph.nodes if n.name == name), None)
    return node is not None and node.op == "get_attr" \
        and node.target in handed_values(candidate.gm)


def _computing_op(row: NodeDiff, reference: IntrospectGraph, candidate: IntrospectGraph,
                  *, keep_dropout: bool = False) -> tuple[str, str, str, str]:
    """(reference node, candidate node, op, detail): layout ops looked through.

    A dropout is looked through too, unless its values show it active (``keep_dropout``):
    then it computed the difference itself.
    """
    if keep_dropout and row.op in ("Dropout", "dropout"):
        return row.reference_node, row.candidate_node, row.op, ""
    ref_chain = _chain(reference, row.reference_node)
    cand_chain = _chain(candidate, row.candidate_node)
    ref_layers = {r.name: r.layer for r in reference.records}
    while len(ref_chain) > 1 and ref_layers[ref_chain[-1]] != row.layer:
        ref_chain.pop()  # the blame stays in the layer where the values differ
    cand_records = {r.name: r for r in candidate.records}
    if len(ref_chain) == 1 and len(cand_chain) == 1:
        # The reference only picks values (x[:, 0], ids[:, :S]): the candidate computes.
        op = cand_records[row.candidate_node].op_type if row.op in _MOVES else row.op
        return row.reference_node, row.candidate_node, op, ""
    ref_records = {r.name: r for r in reference.records}
    op = cand_records[cand_chain[-1]].op_type
    parts = [f"values first differ at {row.reference_node} ({row.op}), which only moves data"]
    if len(cand_chain) > 1:
        parts.append("candidate: " + " <- ".join(
            f"{n} ({cand_records[n].op_type})" for n in cand_chain))
    if len(ref_chain) > 1:
        parts.append("reference: " + " <- ".join(
            f"{n} ({ref_records[n].op_type})" for n in ref_chain))
    return ref_chain[-1], cand_chain[-1], op, "; ".join(parts)


def _chain(graph: IntrospectGraph, name: str) -> list[str]:
    """``name`` and the nodes up to the first one that computes (through layout ops)."""
    records = {r.name: r for r in graph.records}
    nodes = {n.name: n for n in graph.gm.graph.nodes}
    chain = [name]
    while _moves_data(records, nodes[chain[-1]]):
        node = nodes[chain[-1]]
        inputs = [n.name for n in node.all_input_nodes
                  if records.get(n.name) is not None and records[n.name].kind in ("tensor", "multi")
                  and n.op not in ("get_attr", "placeholder")]
        if len(inputs) != 1:
            break
        chain.append(inputs[0])
    return chain


def _moves_data(records: Mapping[str, Any], node: Any) -> bool:
    op = records[node.name].op_type
    if op == "getitem":  # an item of a split moves data; x[:, 0] picks tokens: it computes
        source = node.args[0] if node.args else None
        return source is not None and getattr(records.get(source.name), "kind", "") == "multi"
    return op in _MOVES


def _tested_hints(context: Mapping[str, Any], row: NodeDiff, snapshot: Any) -> tuple[str, ...]:
    """Hints from ``introspect.diff.hypotheses``: each tested on the captured values."""
    try:
        from introspect.diff.hypotheses import explain_divergence
        from introspect.diff.hypotheses.context import DivergenceContext
    except ImportError:  # the hypotheses package is optional
        return ()
    value = snapshot.local_output
    reference_value = snapshot.reference_output
    if not isinstance(value, torch.Tensor) or value.shape != reference_value.shape:
        return ()
    tolerance = context["tolerance"]
    try:
        return tuple(explain_divergence(DivergenceContext(
            reference_model=context["reference_model"],
            candidate_model=context["candidate_model"],
            inputs=context["inputs"],
            reference_node=row.reference_node, candidate_node=row.candidate_node,
            module=row.module, layer=row.layer,
            reference_value=reference_value, candidate_value=value,
            atol=row.atol if row.atol is not None else tolerance.atol or 0.0,
            rtol=row.rtol if row.rtol is not None else tolerance.rtol or 0.0,
            repeatable=bool(context.get("repeatable", False)),
            scope=str(context.get("scope", "")))))
    except Exception as e:  # a hint must never break the verdict it explains
        return (f"(hypothesis tests failed: {type(e).__name__}: {e})",)


__all__ = ["confirm_failures", "first_divergence"]
