"""Module evidence (tier 2, ``introspect.diff.modules``) in the flow: judged before any
recording where a PASS may rest on it alone, else after the op-level explanation, whose
faithfulness its coverage needs; then joined with the verdict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from introspect.diff import devices
from introspect.diff.flow.candidate import note_edited_weights
from introspect.diff.flow.op_level import name_from_truth, passed_with_rows, take_rows
from introspect.diff.flow.reference import reference_again_where_moved
from introspect.diff.flow.state import DiffState
from introspect.diff.flow.whole_models import judge_whole_models, name_where_runs_part
from introspect.diff.modules import ModuleEvidence, gather_module_evidence
from introspect.diff.modules.accounted import computed_by_glue, unaccounted
from introspect.diff.modules.blocks import block_layers, named_by_block
from introspect.diff.modules.cancelled import (
    Holder,
    cancelled_modules,
    cancelled_nodes_note,
    cancelled_notes,
    cancelling_holders,
    within_cancelled,
)
from introspect.diff.modules.evidence import coverage_of, unseen_regions
from introspect.diff.modules.inference import INFERENCE_DIFFERS
from introspect.diff.modules.paths import within
from introspect.diff.modules.precise import ReferenceCalls
from introspect.diff.modules.stacked import named_by_stacked_slices
from introspect.diff.modules.tables import modules_only
from introspect.diff.ops.divergence import on_a_guess
from introspect.diff.quantized import INT8
from introspect.diff.records import STATUS_FAIL, STATUS_OK
from introspect.run.truth import AUTOGRAD, INFERENCE_MODE, NO_GRAD, identical

MODULES_ONLY_NOTE = (
    "no op-level recording: the outputs and module evidence prove this PASS (every module "
    "within its budget, and every value between them the reference's own or a judged "
    "module's); for node tables pass nodes=True (introspect diff: --out or --nodes)")


def pass_without_recording(state: DiffState) -> None:
    """Where no node tables are asked for: module evidence first, and a PASS it proves
    (the outputs pass, every module within budget, every value between them accounted
    for) needs no recording (``state.fast``); where a module fails, its calls' values are
    kept for ``flow.inside``. After the outputs are judged, before the reference would be
    recorded."""
    assert state.placement is not None  # (placed when the candidate was built)
    state.device_rounding = devices.rounding_dtypes(state.placement, state.reference,
                                                    state.candidate)
    verdict = state.verdict
    state.early = state.later and verdict is not None \
        and not state.switched and INT8 not in state.candidate_dtypes
    if not state.early:
        note_edited_weights(state)
        return
    # module evidence first: with it, a PASS may need no recording, and a FAIL a recording
    # of its failing module alone (``flow.inside``)
    ref_calls, cand_calls = state.ref_calls, state.cand_calls
    state.module_evidence = gather_module_evidence(
        ref_calls, cand_calls, state.tensors.get("attention_mask"), keep_calls=True,
        rounding=state.device_rounding, changing=_changing(state),
        outputs_failed=not verdict.passed)
    # (where some computation is in no judged module)
    judge_whole_models(state, computed_by_glue(ref_calls, cand_calls, state.module_evidence.rows))
    _judge_own_gradients(state)  # (with backward: kept for where the recording cannot go)
    gradients_proven = not state.options.mode.backward or (
        state.own_gradients is not None and state.own_gradients.result is not None)
    if not verdict.passed or _unproven(state.module_evidence, ref_calls, cand_calls) \
            or not gradients_proven:
        # the coverage keeps what it reads of the values; they are let go before any
        # recording (memory: a forward's worth a side), once a failing module's are read
        state.unseen = unseen_regions(cand_calls)
        if state.module_evidence.passed and not verdict.passed:
            ref_calls.calls.clear()
            cand_calls.calls.clear()
        # (where everything passed, they are held until the op level is joined: a node
        # failing there inside a passing module may cancel in it, ``_cancelling_holders``;
        # as with node tables, where the recording runs while they are held)
        note_edited_weights(state)
        return
    state.notes += state.module_evidence.notes + cancelled_notes(state.module_evidence)
    state.notes.append(MODULES_ONLY_NOTE)
    ref_calls.calls.clear()  # the values are let go: memory
    cand_calls.calls.clear()
    reference_again_where_moved(state)
    note_edited_weights(state, state.module_evidence.relations)
    state.fast = modules_only(state.module_evidence)
    if state.own_gradients is not None:
        state.gradients = state.own_gradients.result


def _judge_own_gradients(state: DiffState) -> None:
    """With backward: what each side's own backward proves (``backward.plain_parity``),
    while the calls' values are held: a PASS needing no recording, else the recorded path
    decides; where that path cannot record the candidate, this decides
    (``flow.gradients.compare_gradients``)."""
    if state.cand_plain is None:
        return
    from introspect.diff.backward.plain_parity import judge_plain_gradients

    state.own_gradients = judge_plain_gradients(
        state.loss[0], state.ref_plain, state.cand_plain, state.module_evidence,
        state.reference, state.tolerance, state.tensors.get("attention_mask"),
        state.options.budgets.allow_nonfinite)


def join_module_evidence(state: DiffState) -> None:
    """Module evidence joined with the explained verdict: its coverage (which needed the
    recordings' faithfulness and where they part), or the modules judged now; a failing
    module lets the explanation confirm a guess inside it; then ``ModuleEvidence.join``.
    After the truth divergence: a failing module may name a node where it named none."""
    # Module evidence (tier 2): each module of the candidate's plain calls on the
    # reference's inputs to it, against a budget from its own rounding noise.
    ref_calls, cand_calls = state.ref_calls, state.cand_calls
    holders: dict[tuple[str, str], Holder] = {}
    if state.early:  # judged before the recording: only its coverage waited for it
        state.module_evidence.uncovered = coverage_of(
            state.unseen, state.module_evidence.rows, state.faithful, state.parted)
        holders = _cancelling_holders(state)
        ref_calls.calls.clear()  # the values are let go: memory
        cand_calls.calls.clear()
    elif state.truths:
        state.module_evidence = gather_module_evidence(
            ref_calls, cand_calls, state.tensors.get("attention_mask"), state.faithful,
            state.parted, keep_calls=True, rounding=state.device_rounding,
            changing=_changing(state),
            outputs_failed=state.verdict is not None and not state.verdict.passed)
        glue = computed_by_glue(ref_calls, cand_calls, state.module_evidence.rows)
        holders = _cancelling_holders(state)
        ref_calls.calls.clear()  # the values are let go: memory
        cand_calls.calls.clear()
        state.module_evidence.pairs, state.module_evidence.candidate_calls = [], []
        judge_whole_models(state, glue)
    evidence, explanation = state.module_evidence, state.explanation
    state.notes += evidence.notes
    if explanation.confirm_inside is not None and not evidence.passed \
            and (state.divergence is None or state.divergence.layer == "outputs"):
        # a failing module proves its fault: a guess inside it may name the node
        confirmed, inside = explanation.confirm_inside(
            {r.reference_module for r in evidence.smallest_failing()})
        if inside is not None:
            state.rows, state.divergence = confirmed, inside
    _overrule_where_modules_agree(state, holders)
    state.notes += cancelled_notes(evidence)
    state.passed, state.divergence = evidence.join(state.passed, state.divergence,
                                                   state.faithful, _execution_order(state))
    name_where_runs_part(state)  # (a FAIL still named at the outputs alone)
    if not state.passed and state.divergence is not None:  # (a weight of another layer)
        layers = block_layers(state.reference)
        state.divergence = named_by_block(state.divergence, state.module_evidence.relations,
                                          layers)
        state.divergence = named_by_stacked_slices(  # (a port with no module per layer)
            state.divergence, state.reference, state.candidate,
            state.module_evidence.relations, layers)


def _cancelling_holders(state: DiffState) -> dict[tuple[str, str], Holder]:
    """For each failing op-level row, by (reference node, candidate node), the passing
    module holding both its nodes whose float64 run on the reference's inputs is the
    reference's exactly, running the same ops as in float32
    (``cancelled.cancelling_holders``): a key's bias left out in a layer written as
    functions, whose only module is the layer. While the calls' values are held; {}
    where none is."""
    explanation, evidence = state.explanation, state.module_evidence
    if explanation is None or explanation.confirm_inside is None or state.inside \
            or explanation.graph is None or not evidence.pairs:
        return {}
    modules_of = {r.name: r.module for r in explanation.graph.records}
    failing = {(r.reference_node, r.candidate_node): (modules_of[r.candidate_node], r.module)
               for r in state.rows if r.status == STATUS_FAIL and not r.nonfinite
               and r.candidate_node in modules_of}  # (NaN or inf: judged by them, no gap)
    if not failing:
        return {}
    calls = state.ref_calls.of_mode(AUTOGRAD) or state.ref_calls.of_mode(NO_GRAD)
    holders = cancelling_holders(failing.values(), evidence, ReferenceCalls(calls),
                                 state.tensors.get("attention_mask"),
                                 [u.candidate_module for u in evidence.uncovered])
    return {row: holders[modules] for row, modules in failing.items() if modules in holders}


def _overrule_where_modules_agree(state: DiffState,
                                  holders: Mapping[tuple[str, str], Holder]) -> None:
    """A guess (``ops.divergence.on_a_guess``: confirmed only by the growth of the error
    around it, or paired by the names of weights holding other values) fails nothing
    inside a module that module evidence passed: the candidate's module, run on the
    reference's inputs to it, agrees. Nor does a node inside a module whose difference
    the module holding it cancels exactly (``modules.cancelled``). The verdict is settled
    again on the rows left (no FAIL stands on a guess alone); where the outputs fail, the
    fault is elsewhere, and named there."""
    explanation, evidence, verdict = state.explanation, state.module_evidence, state.verdict
    if explanation.confirm_inside is None or state.inside:
        return
    failing = [r.candidate_module for r in evidence.rows if r.status == STATUS_FAIL]
    cancelled = {m for m in cancelled_modules(evidence)
                 if not any(within(f, m) for f in failing)}
    guessed = any(on_a_guess(r) for r in state.rows)
    failing_rows = any(r.status == STATUS_FAIL for r in state.rows)
    if not guessed and not ((cancelled or holders) and failing_rows):
        return
    passing = {r.candidate_module for r in evidence.rows if r.status == STATUS_OK
               and r.candidate_module and not any(within(f, r.candidate_module)
                                                  for f in failing)}
    rows, divergence = explanation.confirm_inside(set(), passing, cancelled, set(holders))
    if rows == state.rows:
        return
    if holders:
        unconfirmed = sum(1 for before, after in zip(state.rows, rows, strict=True)
                          if before.status == STATUS_FAIL and after.status != STATUS_FAIL)
        state.notes.append(cancelled_nodes_note(holders, unconfirmed))
    take_rows(state, rows, divergence)
    state.passed = passed_with_rows(state)
    if divergence is None and verdict is not None and not verdict.passed:
        name_from_truth(state)  # (module evidence, joined next, may name a module)


def _execution_order(state: DiffState) -> list[str]:
    """The reference's modules in the order their first op ran (its recording's); where
    there is none, in the order they were defined (a norm defined after the attention it
    runs before would come later)."""
    graph = state.ref_side[0] if state.ref_side is not None else None
    if graph is None:
        return [name for name, _ in state.original_reference.named_modules()]
    first: dict[str, None] = {}
    for record in graph.records:
        parts = record.module.split(".") if record.module else []
        for end in range(len(parts) + 1):
            first.setdefault(".".join(parts[:end]), None)
    return list(first)


def _changing(state: DiffState) -> str:
    """"calls": the candidate's forward changed from call to call in its truth runs;
    "inference_mode": its outputs fail under ``torch.inference_mode()`` only (no kept call
    ran there); ``INFERENCE_DIFFERS``: they pass there, but are not its ``no_grad``
    call's; "": none (``modules.reproduced`` names where, ``modules.inference`` judges)."""
    if state.cand_truth is not None and state.cand_truth.changed_between_calls():
        return "calls"
    verdict = state.verdict
    failing = {r.call for r in verdict.rows if r.status == STATUS_FAIL} \
        if verdict is not None else set()
    if failing == {INFERENCE_MODE}:
        return INFERENCE_MODE
    return INFERENCE_DIFFERS if _inference_differs(state) else ""


def _inference_differs(state: DiffState) -> bool:
    """The candidate's outputs under ``inference_mode`` are not its ``no_grad`` call's bit
    for bit (a correct port's are): a branch there, judged by module evidence
    (``modules.inference``) beyond the outputs' loose budget."""
    truth = state.cand_truth
    if truth is None:
        return False
    there, plain = truth.outputs_of(INFERENCE_MODE), truth.outputs_of(NO_GRAD)
    return there is not None and plain is not None and any(
        not identical(value, plain.get(name)) for name, value in there.items())


def _unproven(evidence: ModuleEvidence, ref_calls: Any, cand_calls: Any) -> list[str]:
    """Why a PASS cannot rest on module evidence alone ([]: it can)."""
    if not evidence.passed:
        return ["a module is over its budget"]
    if evidence.uncovered:
        return ["a region the recording could not see"]
    if evidence.notes:
        return evidence.notes
    # a weight of its own: a module over it may still agree (not one whose difference
    # cancels exactly in the module holding it: that module's float64 run proves it)
    unrelated = [w for w in evidence.unrelated if not within_cancelled(w, evidence)]
    if unrelated:
        return [f"weights that hold none of the reference's ({', '.join(unrelated[:3])})"]
    if not any(r.status == "ok" for r in evidence.rows):
        return ["no module evidence"]
    return unaccounted(ref_calls, cand_calls, evidence.rows)


__all__ = ["MODULES_ONLY_NOTE", "join_module_evidence", "pass_without_recording"]
