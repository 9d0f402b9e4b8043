"""The candidate's side of the flow: built once the reference's truth is taken (with the
process-wide switches its build flips read and named), its plain calls, and the outputs
judged against the reference's: the verdict every later step refines."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from introspect.diff import devices
from introspect.diff.flow.gradients import candidate_own_backward
from introspect.diff.flow.reference import reference_again
from introspect.diff.flow.state import (
    DiffState,
    compiled,
    copies,
    holds_script,
    modes_that_count,
    training_modes,
    training_note,
)
from introspect.diff.modules.pairing import Relations
from introspect.diff.ops.explain import accepted_inputs, model_dtypes
from introspect.diff.outputs import NoOutputPairs
from introspect.diff.quantized import holds_quantized, is_quantized, quantized_word
from introspect.diff.records import STATUS_FAIL
from introspect.errors import InputError
from introspect.models.ports import describe_changes
from introspect.run import switches
from introspect.run.capture import capture_calls
from introspect.run.modes import set_mode
from introspect.run.truth import edited_weights, run_truth, weight_sums


def build_candidate(state: DiffState) -> None:
    """The candidate built (a ``Deferred`` one: after the reference's truth, so that its
    code cannot have touched it), the switches its build flipped read, the reference
    checked under them before anything replays it; then both models in eval mode, their
    training modes noted, the candidate's inputs on its device, and its dtypes read."""
    if state.deferred is not None:
        state.before_build = switches.snapshot()
        state.candidate = state.deferred.build()
        state.switched = switches.flipped(state.before_build, switches.snapshot())
        if state.switched and state.ref_truth is not None:  # before anything replays the reference
            reference_again(state)
        state.placement = devices.place(state.reference, state.candidate)  # nothing moves
    assert state.placement is not None
    state.cand_tensors = copies(devices.to_device(state.tensors,
                                                  state.placement.candidate_device))
    state.modes["candidate"] = training_modes(state.candidate)
    models = {"reference": state.original_reference, "candidate": state.candidate}
    counted = {side: modes_that_count(models[side], training)
               for side, training in state.modes.items()}
    state.notes = [training_note(side, training) for side, training in counted.items()
                   if any(training.values())]
    set_mode(state.candidate, False)
    state.candidate_dtypes = sorted(model_dtypes(state.candidate))  # qint8: int8 Linears


def take_candidate_truth(state: DiffState) -> None:
    """The candidate's plain calls (twice: a forward that changes between calls shows it)
    and what each of its modules saw, with a forward that edits its own weights named;
    after the reference's truth and any float64 recording of it."""
    candidate = state.candidate
    sums = weight_sums(candidate)
    backward = candidate_own_backward(state)  # (with backward, where the reference's was)
    with _switches_named(state.switched, state.candidate_label), \
            capture_calls(candidate, share=state.ref_calls,
                          gradients=backward is not None) as cand_calls:
        state.cand_truth = run_truth(candidate, accepted_inputs(candidate, state.cand_tensors),
                                     grad_calls=2, inference=not holds_script(candidate),
                                     lean=not compiled(candidate), backward=backward,
                                     label=_named(state.candidate_label, candidate))
    state.cand_calls = cand_calls
    if state.options.mode.backward and holds_quantized(candidate) and any(
            is_quantized(call.module) for call in cand_calls.calls):  # (an unused head: no)
        raise InputError(
            f"the {state.candidate_label} runs {quantized_word(candidate)} quantized Linears, "
            "which autograd does "
            "not differentiate: diff its forward, or its float model with --backward")
    state.candidate_sums = sums  # held to the weights after its calls once they are read
    # for the pairing (``note_edited_weights``)


def _named(label: str, candidate: Any) -> str:
    """How an error names the candidate: its build (``port.py:build``) and its class."""
    kind = type(candidate).__name__
    return f"the candidate {label} ({kind})" if label and label != "candidate" else kind


def note_edited_weights(state: DiffState,
                        relations: Mapping[str, set[str]] | None = None) -> None:
    """A forward that edits its own weights (``weight.data *= 1.001``, which no version
    counter sees), named as such in a note: each weight's checksum before the candidate's
    calls held to its checksum after them. Once, after the calls and before any other run
    of the candidate's whole forward.

    ``relations``, proven after the calls, and the reference's footprint read at the end
    (``state.reference_now``) spare reading the weights again: a weight found holding a
    reference weight's bytes then (``Relations.same_bytes``) has that weight's checksum,
    and where the reference's checksum is what it was before the candidate was built, the
    footprint read it after the proof (nothing of the candidate ran in between)."""
    before, state.candidate_sums = state.candidate_sums, None
    if before is None:
        return
    theirs_before = state.before_candidate.sums if state.before_candidate else {}
    theirs_now = state.reference_now.sums if state.reference_now else {}
    proven = relations.same_bytes if isinstance(relations, Relations) else {}
    after: dict[str, int] = {}
    unread = []
    for name in before:
        ref = proven.get(name)
        if ref is not None and ref in theirs_now and theirs_before.get(ref) == theirs_now[ref]:
            after[name] = theirs_now[ref]
        else:
            unread.append(name)
    if unread:
        after.update(weight_sums(state.candidate, only=set(unread)))
    edited = edited_weights(before, after)
    if edited:  # named as such, not as dropout or a weight left unloaded
        shown = describe_changes(edited, most=3)
        state.notes.append(f"the {state.candidate_label}'s forward edits its own weights "
                           f"({shown}): they changed during its calls, so each call computes "
                           "with other values")


def judge_outputs(state: DiffState) -> None:
    """The outputs of the two plain calls compared (``diff.outputs``): the verdict, which
    every later step refines, so it comes right after the candidate's calls. Outputs that
    cannot be paired are kept to raise after the recording's notes; a build that flipped
    switches is judged once more with them put back."""
    assert state.ref_truth is not None and state.placement is not None
    state.judge_dtypes = [*model_dtypes(state.original_reference), *state.candidate_dtypes,
                          *devices.rounding_dtypes(state.placement, state.reference,
                                                   state.candidate)]
    try:
        state.verdict = state.judge(state.cand_truth)
        state.notes += state.verdict.notes
    except NoOutputPairs as e:  # the alignment's words first (other sizes, ...)
        state.unpaired, state.truths = e, False
    if state.switched and state.verdict is not None:
        state.notes.append(_judged_with_switches_back(state))


def _judged_with_switches_back(state: DiffState) -> str:
    """The candidate called once more with every switch its build flipped put back, judged
    like its other calls (``run.switches``): the note that says so."""
    verdict, switched, label = state.verdict, state.switched, state.candidate_label
    candidate = state.candidate
    inputs = accepted_inputs(candidate, state.cand_tensors)
    shown = switches.describe(switched)
    with switches.put_back(state.before_build):
        again = run_truth(candidate, inputs, lean=not compiled(candidate))
    judged = state.judge(again)
    if judged.passed:
        return (f"the {label}'s build switched {shown} for the whole process: the reference "
                "computes the same under it (checked again), and the candidate, called once "
                "more with it put back, agrees too")
    verdict.passed = False
    verdict.reasons.append("rests on a switch its build flipped")
    verdict.rows += [dataclasses.replace(r, call=f"{r.call}, {', '.join(switched)} put back")
                     for r in judged.rows if r.status == STATUS_FAIL]  # what decided
    worst = judged.worst_failing()
    where = f" ({worst.reference_output} off by {worst.max_abs_err:.3g})" if worst else ""
    return (f"the {label}'s build switched {shown} for the whole process, and with it put "
            f"back the candidate's outputs part from the reference's{where}: its parity "
            "rests on the switch")


@contextlib.contextmanager
def _switches_named(switched: Mapping[str, Any], label: str) -> Iterator[None]:
    """A candidate that cannot run under the switches its build flipped: said so, naming
    them (its class may share the reference's name: the error would read as the
    reference's)."""
    try:
        yield
    except InputError as e:
        if not switched:
            raise
        cause = str(e).split(". ")[0].rstrip(".")
        raise InputError(f"the {label}'s build switched {switches.describe(switched)} "
                         f"process-wide, and it cannot run so: {cause}") from e


__all__ = ["build_candidate", "judge_outputs", "note_edited_weights", "take_candidate_truth"]
