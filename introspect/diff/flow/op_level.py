"""Op evidence (tier 3, ``introspect.diff.ops``) in the flow: the candidate recorded and
replayed beside the reference's recording, the recordings held to the plain calls, int8
outputs explained, and the verdict settled with the divergence the truth runs name."""

from __future__ import annotations

import dataclasses
from typing import Any

from introspect.diff.flow.state import DiffState
from introspect.diff.int8_outputs import explained_by_int8
from introspect.diff.ops.eager import record_forward
from introspect.diff.ops.explain import accepted_inputs, explain
from introspect.diff.ops.faithful import (
    faithful_recordings,
    output_region,
    recorded_call_verdict,
    truth_divergence,
)
from introspect.diff.quantized import INT8
from introspect.diff.records import STATUS_DRIFT, STATUS_FAIL, STATUS_UNCONFIRMED
from introspect.run.boundaries import where_paths_part


def explain_ops(state: DiffState) -> None:
    """The full path: the candidate recorded, aligned with the reference's recording and
    replayed beside it, pair by pair (``ops.explain``): the node rows and their first
    divergence. Once the reference's recording is made; outputs that could not be paired
    are raised only now, after the alignment's notes say why."""
    gradients_with, candidate = state.gradients_with, state.candidate
    state.explanation = explanation = explain_with(
        state, state.recorded_already[1],
        gradients_with if gradients_with is not None
        and getattr(candidate, "_orig_mod", None) is None else record_forward)
    state.notes += explanation.notes
    if state.unpaired is not None:
        raise state.unpaired
    take_rows(state, explanation.rows, explanation.divergence)


def explain_with(state: DiffState, recording: Any, recorder: Any) -> Any:
    """``ops.explain`` on this diff's models, inputs and budgets: the candidate's
    ``recording`` (None: made now by ``recorder``) beside the reference's."""
    options = state.options
    assert state.ref_side is not None  # (recorded above where the fast path was not taken)
    return explain(
        state.ref_side, state.candidate, state.tensors, state.candidate_label,
        state.keywords[1], state.tolerance, state.noise, state.candidate_dtypes,
        name_map=options.tables.name_map, allow_nonfinite=options.budgets.allow_nonfinite,
        forward_keywords=options.mode.forward_keywords,
        noise_budget=options.budgets.noise_budget, reference=state.reference,
        raise_errors=state.verdict is None,
        agreeing_outputs=(),  # see docs/verdict.md: not yet sound
        placement=state.placement, recording=recording,
        original_reference=state.original_reference, recorder=recorder,
        repeatable=state.candidate_repeatable())


def take_rows(state: DiffState, rows: list[Any], divergence: Any) -> None:
    """The node rows and their divergence as the verdict's, and whether they alone pass
    (a replay that did not reproduce its recording never does)."""
    state.rows, state.divergence = rows, divergence
    state.explained_passed = divergence is None \
        and not any(r.status == STATUS_FAIL for r in rows) \
        and not state.explanation.unfaithful


def hold_recordings_to_truth(state: DiffState) -> None:
    """Each recording held to its model's plain calls (``ops.faithful``): where one does
    not reproduce them, node-level values decide nothing; the recording, one more call of
    the candidate, judged like the others. Right after the explanation made them."""
    if not state.truths:
        return
    assert state.ref_truth is not None and state.verdict is not None
    verdict, explanation = state.verdict, state.explanation
    state.faithful, faith_notes, state.parted = faithful_recordings(
        state.ref_truth, state.ref_side[2], state.cand_truth, explanation.recording,
        state.candidate, accepted_inputs(state.candidate, state.cand_tensors), state.labels,
        state.options.budgets.noise_budget)
    state.notes += faith_notes
    late = recorded_call_verdict(state.judge, state.cand_truth, explanation.recording,
                                 state.candidate_label)
    if verdict.passed and late is not None:  # another call of its, over budget
        verdict.passed, state.random = False, True
        verdict.reasons.append("changes from call to call")
        state.notes.append(late)


def explain_int8_outputs(state: DiffState) -> None:
    """Outputs over budget while every pair, the int8 Linears included, is within its own:
    the reference run with the candidate's int8 Linears in place of its float ones
    (``int8_outputs``) may compute the candidate's outputs, and then the verdict is its.
    Once the node rows are known, before the backward and the settled verdict."""
    verdict, explanation = state.verdict, state.explanation
    if verdict is None or verdict.passed or not state.explained_passed \
            or explanation.graph is None or INT8 not in state.candidate_dtypes:
        return
    explained = explained_by_int8(
        verdict, state.original_reference, state.candidate, state.cand_truth,
        explanation.alignment.relations, state.ref_accepted,
        lambda ref, cand: state.judge(cand, ref), state.labels)
    if explained is not None:  # the hybrid reference computes the candidate's outputs
        state.verdict = explained
        state.notes.append(explained.notes[-1])
    else:
        state.notes.append(_int8_outputs_note(verdict))


def settle_verdict(state: DiffState) -> None:
    """The verdict from the outputs and the node rows together, and where a failing truth
    run diverges when the rows cannot say (``truth_divergence``; it may run the candidate
    once more to find where the paths part, and so keeps its place after the backward's
    calls). Before module evidence is joined; the gradients' verdict joins in the result."""
    verdict, truths = state.verdict, state.truths
    state.passed = passed_with_rows(state)
    if state.explanation.graph is not None and not rows_trusted(state) and not state.random \
            and not _dropout_seen(state.divergence) and not _edits_its_weights(state):
        _rows_decide_nothing(state)
    state.random = state.random or bool(truths and state.cand_truth.changed_between_calls())
    if verdict is not None and not verdict.passed \
            and (state.divergence is None or (not rows_trusted(state) and not state.random
                                              and not _dropout_seen(state.divergence)
                                              and not _edits_its_weights(state))):
        # (a forward that changes from call to call cannot be reproduced by any
        # recording: its node-level divergence, dropout's hint and all, stands; a replay
        # that did not reproduce its recording names nothing: a functional_call template
        # replayed with its own uninitialised weights named layer 0)
        name_from_truth(state)


def _dropout_seen(divergence: Any) -> bool:
    """The rows' divergence found a dropout left active in the values (a seeded one draws
    the same mask on every plain call, and otherwise in the replay): the replay differs
    because of it, and the node it names is where it acts."""
    return divergence is not None and any(
        h.startswith("dropout is active") for h in divergence.hints)


def _edits_its_weights(state: DiffState) -> bool:
    """The candidate changes its own weights as it runs (a note says so, or it is decoded
    step by step, where a step may find a weight edited between steps): its replay differs
    for that reason, and the rows name the module reading the edited weight."""
    stepping = bool(state.options.mode.generate) \
        or state.options.mode.forward_keywords is not None  # (a generation step's diff)
    return stepping or any("edits its own weights" in note for note in state.notes)


def _rows_decide_nothing(state: DiffState) -> None:
    """Node rows of a recording or replay that did not reproduce the plain calls
    (``rows_trusted``) over their budget are unconfirmed, with a note, and name no
    divergence: their layers read FAIL and the verdict line the replay's error (inf for
    a ``functional_call`` template replayed with its own uninitialised weights) on a
    PASS, and a FAIL named their first row's layer."""
    why = ("the replay did not reproduce the plain calls here: its values decide "
           "nothing, the plain calls and module evidence do")
    state.rows = [dataclasses.replace(row, status=STATUS_UNCONFIRMED,
                                      note="; ".join(n for n in (row.note, why) if n))
                  if row.status in (STATUS_FAIL, STATUS_DRIFT) else row
                  for row in state.rows]
    state.divergence = None


def passed_with_rows(state: DiffState) -> bool:
    """The outputs' verdict joined with the node rows', where the recordings are faithful
    to the plain calls (else the rows decide nothing)."""
    verdict = state.verdict
    if verdict is None:
        return state.explained_passed
    if rows_trusted(state):
        return verdict.passed and state.explained_passed
    return verdict.passed


def rows_trusted(state: DiffState) -> bool:
    """The node rows can say something: both recordings reproduce their models' plain
    calls, and their replays reproduce the recordings. A replay that does not (a region
    its recorded ops run otherwise than the call did: compiled code, an autocast region)
    proves nothing either way: the plain calls and module evidence decide."""
    return state.explanation.graph is not None and state.faithful \
        and not state.explanation.unfaithful


def name_from_truth(state: DiffState) -> None:
    """The divergence of failing truth runs the rows cannot name: where the plain call
    leaves the recorded path, if anywhere, else the outputs (``truth_divergence``)."""
    if state.parted is None:  # where a plain call leaves the recorded path, if anywhere
        state.parted = where_paths_part(state.candidate,
                                        accepted_inputs(state.candidate, state.cand_tensors))
    state.divergence = truth_divergence(state.verdict, state.parted,
                                        state.explanation.alignment.relations)
    if state.divergence is not None and state.ref_side is not None:
        state.divergence = output_region(state.divergence, state.verdict, state.ref_side[0])


def _int8_outputs_note(verdict: Any) -> str:
    """Int8 Linears within their budget everywhere, the outputs beyond what they explain."""
    worst = max((r.max_abs_err or 0.0 for r in verdict.rows), default=0.0)
    return (f"every pair is within its budget (the int8 Linears within what int8 rounding "
            f"explains), yet the outputs move by up to {worst:.3g}, more than the reference "
            "run with the candidate's int8 Linears in place of its float ones reproduces: "
            "something outside the Linears differs (--atol widens the outputs' budget only)")


__all__ = ["explain_int8_outputs", "explain_ops", "explain_with", "hold_recordings_to_truth",
           "name_from_truth", "passed_with_rows", "rows_trusted", "settle_verdict",
           "take_rows"]
