"""The backward's part in the flow (``introspect.diff.backward``): one recorded forward per
side serves both comparisons where it can; the reference's backward runs before the
candidate is built; the gradients are compared once the forward is explained."""

from __future__ import annotations

from typing import Any

from introspect.diff.flow.state import DiffState, copies
from introspect.errors import InputError


def one_forward_for_both(state: DiffState) -> Any:
    """``record_with_gradients`` where the backward diff can go on from the forward diff's
    recordings (not with a float64 reference, nor with recordings made already)."""
    mode = state.options.mode
    if not mode.backward or state.options.budgets.noise_budget or mode.recordings is not None:
        return None
    _check_loss(mode.loss)
    from introspect.diff.backward.record import record_with_gradients

    return record_with_gradients


def own_backward(state: DiffState, reference: Any) -> Any:
    """With backward and no node tables: the reference's own backward of its first plain
    call, on the diff's loss (``backward.plain``), taken clean with its truth; what
    ``run_truth`` calls with that call's outputs."""
    mode = state.options.mode
    _check_loss(mode.loss)
    from introspect.diff.backward.parity import backward_loss
    from introspect.diff.backward.plain import PlainGradients

    state.loss_inputs = copies(state.ref_tensors)
    state.loss = backward_loss(reference, state.ref_accepted, mode.loss, state.loss_inputs)
    state.ref_plain = PlainGradients()
    return state.ref_plain.taker(reference, state.loss[1])


def candidate_own_backward(state: DiffState) -> Any:
    """The candidate's own backward of its first plain call, on the same loss, where the
    reference's was taken (None: not)."""
    if state.ref_plain is None:
        return None
    from introspect.diff.backward.plain import PlainGradients

    state.cand_plain = PlainGradients()
    return state.cand_plain.taker(state.candidate, state.loss[1], detached_ok=True)


def held_to_own_backward(state: DiffState) -> None:
    """The reference's recorded backward, made after the candidate was built, held to its
    own backward taken clean: a build that changed how the reference differentiates
    (a patched backward, a kernel) would otherwise judge the candidate against it."""
    from introspect.diff.backward.plain_parity import gradients_moved
    from introspect.run.reference import ReferenceChanged

    moved = gradients_moved(state.ref_gradients, state.ref_plain, state.tolerance)
    if moved:
        raise ReferenceChanged(
            f"the reference's gradient of {moved} changed after the {state.candidate_label}'s "
            "build: it changed how the reference differentiates; no verdict")


def gradients_now(state: DiffState) -> None:
    """The reference's backward, on the forward its recording ran; the recording lets go
    of it, and the backward of its values and autograd graph (memory: they would be held
    beside the candidate's whole run; the local backwards of a failing gradient run the
    reference's forward again, checked the same: ``backward.parity.reference_again``)."""
    from introspect.diff.backward.parity import backward_loss

    assert state.ref_side is not None
    state.loss_inputs = copies(state.ref_tensors)
    graph, accepted, recording = state.ref_side
    run, recording.run = recording.run, None
    _, loss_fn = backward_loss(state.reference, accepted, state.options.mode.loss,
                               state.loss_inputs)
    state.ref_gradients = run.backward(loss_fn, keep_values=False)


def compare_gradients(state: DiffState) -> None:
    """Gradient parity (``introspect.diff.backward``) when asked for (``state.gradients``;
    None without backward). After the forward's node rows, since the backward reads each
    pair's forward status; before the verdict is settled, which joins the gradients'."""
    mode, explanation, budgets = state.options.mode, state.explanation, state.options.budgets
    if not mode.backward:
        if mode.loss is not None:
            raise InputError("loss= is used only with backward=True")
        state.gradients = None
        return
    own = state.own_gradients
    decided = None if own is None else own.result or own.failing
    if explanation.graph is None and decided is not None:
        # the own backwards decide: every weight paired by proof and its gradient within
        # budget (and every paired module output's), or weights over budget
        state.gradients = decided
        decided.notes.append(
            "the candidate could not be recorded with autograd on (see the notes): each "
            "side's own backward decides, no node gradient compared")
        return
    if explanation.graph is None:
        raise InputError("backward=True compares gradients node by node, and the candidate "
                         "could not be recorded (see the notes); diff it without backward")
    _check_loss(mode.loss)
    from introspect.diff.backward import backward_diff

    state.gradients = backward_diff(
        state.original_reference, state.candidate, copies(state.ref_side[1]),
        copies(explanation.cand_inputs or {}),
        explanation.alignment, state.ref_side[0], explanation.graph, state.tolerance,
        loss=mode.loss, noise_budget=budgets.noise_budget,
        attention_mask=state.tensors.get("attention_mask"),
        forward_status={r.reference_node: r.status for r in state.rows
                        if r.reference_node and r.candidate_node},
        allow_nonfinite=budgets.allow_nonfinite, reference_gradients=state.ref_gradients,
        candidate_run=getattr(explanation.recording, "run", None),
        loss_inputs=state.loss_inputs)
    if own is not None and own.failing is not None and state.gradients.passed:
        # the own backward of the first call proved weights over budget; the recorded one,
        # a later call, agrees: a backward that changes from call to call, and the proof
        # stands (the user's first step trains otherwise)
        recorded, state.gradients = state.gradients, own.failing
        state.gradients.notes.append(
            "the candidate's own backward of its first plain call is over budget on "
            f"weights paired by proof, while its recorded backward, a later call, agrees "
            f"({len(recorded.rows)} node gradients within budget): its backward changes "
            "from call to call")


def _check_loss(loss: Any) -> None:
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be a callable loss(outputs, inputs) -> scalar, got "
                         f"{type(loss).__name__}")


__all__ = ["candidate_own_backward", "compare_gradients", "gradients_now",
           "held_to_own_backward", "one_forward_for_both", "own_backward"]
