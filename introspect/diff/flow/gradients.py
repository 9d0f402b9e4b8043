"""The backward's part in the flow (``introspect.diff.backward``): one recorded forward per
side serves both comparisons where it can; the reference's backward runs before the
candidate is built; the gradients are compared once the forward is explained."""

from __future__ import annotations

import dataclasses
from typing import Any

from introspect.diff.backward.hints import CUT, autograd_off_hint
from introspect.diff.backward.parting import parted_at_an_output
from introspect.diff.backward.results import STATUS_FAIL
from introspect.diff.flow.state import DiffState, compiled, copies
from introspect.diff.ops.outside import handed_from_outside
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
    from introspect.diff.backward.record import for_side

    state.loss_inputs = copies(state.ref_tensors)
    state.loss = backward_loss(reference, state.ref_accepted, mode.loss, state.loss_inputs)
    state.ref_plain = PlainGradients()
    return state.ref_plain.taker(reference, for_side(state.loss[1], "reference"))


def candidate_own_backward(state: DiffState) -> Any:
    """The candidate's own backward of its first plain call, on the same loss, where the
    reference's was taken (None: not)."""
    if state.ref_plain is None:
        return None
    from introspect.diff.backward.plain import PlainGradients
    from introspect.diff.backward.record import for_side

    state.cand_plain = PlainGradients()
    return state.cand_plain.taker(state.candidate, for_side(state.loss[1], "candidate"),
                                  detached_ok=True)


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
    from introspect.diff.backward.record import for_side

    assert state.ref_side is not None
    state.loss_inputs = copies(state.ref_tensors)
    graph, accepted, recording = state.ref_side
    run, recording.run = recording.run, None
    _, loss_fn = backward_loss(state.reference, accepted, state.options.mode.loss,
                               state.loss_inputs)
    state.ref_gradients = run.backward(for_side(loss_fn, "reference"), keep_values=False)


def compare_gradients(state: DiffState) -> None:
    """Gradient parity (``introspect.diff.backward``) when asked for (``state.gradients``;
    None without backward). After the forward's node rows, since the backward reads each
    pair's forward status; before the verdict is settled, which joins the gradients'."""
    _compare_gradients(state)
    _say_what_switched_autograd_off(state)


def _say_what_switched_autograd_off(state: DiffState) -> None:
    """A cut named at a module the candidate ran with autograd off (a reentrant checkpoint
    around its embeddings, probe round m): the hint says so."""
    found = state.gradients.first_divergence if state.gradients is not None else None
    grad_off = getattr(state.cand_calls, "grad_off", None)
    if found is None or not grad_off or not found.candidate_module \
            or not any(CUT in hint for hint in found.hints):
        return
    if _layer_trains_as_the_references(state, found.layer):
        return  # (its output got a gradient after all: a region whose input needs one)
    hint = autograd_off_hint(found.candidate_module, grad_off)
    if hint is not None:
        state.gradients.first_divergence = dataclasses.replace(
            found, hints=(*found.hints, hint))


def _layer_trains_as_the_references(state: DiffState, layer: str) -> bool:
    """Whether the weights of the reference's ``layer`` have gradients, each within budget:
    a region the candidate ran with autograd off there was handed a gradient anyway (a
    reentrant checkpoint whose input requires one), so its output was not cut."""
    from introspect.diff.modules.evidence import ReferenceLayers

    layers = ReferenceLayers.of(state.original_reference)
    rows = [row for row in state.gradients.parameter_rows
            if layers.of_module(row.reference.rpartition(".")[0]) == layer]
    return bool(rows) and all(row.status != STATUS_FAIL for row in rows)


def _compare_gradients(state: DiffState) -> None:
    mode, explanation, budgets = state.options.mode, state.explanation, state.options.budgets
    if not mode.backward:
        if mode.loss is not None:
            raise InputError("loss= is used only with backward=True")
        state.gradients = None
        return
    hole = explanation.graph is not None and handed_from_outside(explanation.graph)
    if (explanation.graph is None or hole) and state.own_gradients is None and state.truths:
        # (with node tables: not taken with the plain calls); a recording handed values
        # from a thread or NumPy cannot take the weights used there: the own backwards do
        own_gradients_late(state)
    own = state.own_gradients
    decided = None if own is None else own.result or own.failing
    if explanation.graph is None and decided is not None:
        # the own backwards decide: every weight paired by proof and its gradient within
        # budget (and every paired module output's), or weights over budget
        state.gradients = decided if decided.passed else _own_against_noise(state)
        state.gradients.notes.append(
            "the candidate could not be recorded with autograd on (see the notes): each "
            "side's own backward decides, no node gradient compared")
        return
    if explanation.graph is None and _forward_fails(state):
        # the verdict is a FAIL already, taken on the forward's own evidence: said, with
        # the gradients not compared, rather than no verdict
        state.gradients = None
        state.notes.append(
            "gradients not compared: the candidate could not be recorded with autograd on "
            "(see the notes), and its forward fails already")
        return
    if explanation.graph is None:
        why = " ".join(explanation.failure.split())
        why = why if len(why) <= 120 else why[:119].rstrip() + "…"
        undecided = own.why if own is not None and own.why else "no own backward"
        raise InputError(
            f"backward=True could not record the candidate ({why or 'see the notes'}), and "
            f"each side's own backward proves nothing ({undecided})")
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
    if not state.gradients.passed:
        state.gradients = _recorded_against_noise(state, state.gradients)
    # the own backwards decide over a recorded PASS; and over a recorded FAIL too where
    # the recording was handed values from outside it: blind to the weights used there,
    # it names the node gradients after them, not the weight whose gradient is wrong
    overrules = state.gradients.passed or hole
    if own is None and state.gradients.passed and state.truths \
            and not state.changes_between_calls():
        # (node tables asked for: the plain calls took no own backward) a recorded PASS
        # is held to the user's own backward too: a weight read through ``.detach()`` is
        # read by no recorded node, and gets no row there (probe round m)
        own = _own_late_or_none(state)
    if own is not None and own.failing is not None and overrules:
        own.failing = _own_against_noise(state)
    if own is not None and own.failing is not None and not own.failing.passed and overrules:
        recorded, state.gradients = state.gradients, own.failing
        state.gradients.notes.append(_why_the_recording_agreed(recorded, own.failing, hole))
    elif not state.gradients.passed and state.truths:
        if own is None and not state.changes_between_calls():  # (node tables asked for:
            # the plain calls took no own backward; one more call of a candidate that
            # changes between calls would be another model's)
            own = _own_late_or_none(state)  # (what the own backwards refuse names
            # nothing here: the recorded FAIL stands as it is)
        if own is not None and own.failing is not None:
            _name_where_parted(state, own.failing.first_divergence)


def _why_the_recording_agreed(recorded: Any, own: Any, hole: bool) -> str:
    """Why the recorded backward passed where the user's own backward proved weights over
    budget: blind where it was handed values computed outside it (``hole``); blind to a
    weight held untrained (it takes its own gradients of every weight it records) and to
    one it compared no gradient of (read through ``.detach()``: no recorded op reads it
    with one); else, having compared the weights within budget in a later call, a
    backward that changes from call to call (the proof of the first call stands)."""
    if hole:
        verdict = "within budget" if recorded.passed else "some over budget"
        return ("the candidate's own backward is over budget on weights paired by proof, "
                "which its recording was blind to: it was handed values computed outside it "
                f"(a worker thread, NumPy; the {len(recorded.rows)} node gradients it saw: "
                f"{verdict})")
    compared = {row.reference for row in recorded.parameter_rows
                if row.max_abs_err is not None}
    over = [row for row in own.parameter_rows if row.status == STATUS_FAIL]
    held = [row.reference for row in over if row.relation == "held untrained"]
    unseen = [row.reference for row in over
              if row.reference not in held and row.reference not in compared]
    if len(held) + len(unseen) < len(over):
        return ("the candidate's own backward of its first plain call is over budget on "
                "weights paired by proof, while its recorded backward, a later call, agrees "
                f"({len(recorded.rows)} node gradients within budget): its backward changes "
                "from call to call")
    if unseen:
        return (f"the candidate's recorded backward compared no gradient of "
                f"{_some(unseen)}, which its own backward proves over budget: no recorded op "
                "reads that weight with a gradient (read through .detach() or .data, or its "
                "gradient cut)")
    return (f"the candidate's recorded backward takes its own gradient of {_some(held)}, "
            "which the port holds untrained: only its own backward shows that")


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")


def _own_late_or_none(state: DiffState) -> Any:
    """``own_gradients_late``'s answer, or None where the own backwards refuse."""
    try:
        own_gradients_late(state)
    except InputError:
        return None
    return state.own_gradients


def _name_where_parted(state: DiffState, parted: Any) -> None:
    """A recorded backward FAIL named in another layer than the one where the own
    backwards' handed gradients part (``backward.parting``): going from the loss, every
    module output was handed a gradient within budget down to that layer's, and the value
    it took was handed one over budget, so its backward is where they part. The recorded
    path names a node by its local backward, which a cut graph misplaces: a Llama block's
    residual taken detached was named at the final norm (whose local region runs back
    through the unpaired residual adds) or at the add before the block (the node the cut
    gradient no longer reaches). Named where they part, the recorded rows and hints kept;
    where no module output's gradient was over budget (the own backwards named what took
    an embedding's output: weaker than a node's local backward), the recorded node stands."""
    recorded = state.gradients.first_divergence
    if parted is None or not parted_at_an_output(parted) or recorded is None \
            or recorded.layer == parted.layer:
        return
    state.gradients.first_divergence = dataclasses.replace(
        parted, hints=(*parted.hints, *recorded.hints))
    state.gradients.notes.append(
        f"the recorded backward's first divergence ({recorded.reference_node} in "
        f"{recorded.module or recorded.layer}) is not where the gradients the user's own "
        f"backward handed the modules' outputs part ({parted.module}): named there")


def own_gradients_late(state: DiffState) -> None:
    """Each side's own backward, taken now: with node tables asked for, the plain calls
    took none, and the candidate turned out not to be recordable (compiled, a worker
    thread, ``vmap``). One more plain call per side with autograd on, its module calls
    captured with the gradients they are handed, then ``judge_plain_gradients`` as a
    PASS without recording judges them. The reference's own backward is held to its
    recorded one, taken clean before the candidate was built (``held_to_own_backward``):
    a build that changed how it differentiates is refused, not judged against."""
    from introspect.diff.backward.plain_parity import judge_plain_gradients
    from introspect.diff.modules import gather_module_evidence
    from introspect.diff.ops.explain import accepted_inputs
    from introspect.run.capture import capture_calls
    from introspect.run.truth import run_truth

    reference, candidate = state.reference, state.candidate
    taker = own_backward(state, reference)
    with capture_calls(reference, gradients=True) as ref_calls:
        run_truth(reference, state.ref_accepted, lean=not compiled(reference), backward=taker)
    if state.ref_gradients is not None:
        held_to_own_backward(state)
    with capture_calls(candidate, share=ref_calls, gradients=True) as cand_calls:
        run_truth(candidate, accepted_inputs(candidate, state.cand_tensors),
                  lean=not compiled(candidate), backward=candidate_own_backward(state))
    evidence = gather_module_evidence(ref_calls, cand_calls, state.tensors.get("attention_mask"),
                                      keep_calls=True, rounding=state.device_rounding)
    state.module_evidence = evidence  # (what the noise's re-judgement reads; the forward's
    # module evidence is gathered again from the truth runs when it is joined)
    state.own_gradients = judge_plain_gradients(
        state.loss[0], state.ref_plain, state.cand_plain, evidence, reference,
        state.tolerance, state.tensors.get("attention_mask"),
        state.options.budgets.allow_nonfinite)


def _noise_allowed(state: DiffState, result: Any) -> bool:
    """A failing backward may be judged again against the reference's rounding noise: the
    budgets were the defaults, and nothing the reference computes with moved since it was
    taken clean (``run.footprint``; a late float64 run of a changed reference would measure
    the change as noise), and the forward passes. Where it moved, a note says the FAIL
    stands unmeasured."""
    if result.passed or not result.by_budget or state.options.budgets.noise_budget \
            or state.clean_footprint is None or _forward_fails(state):
        return False
    from introspect.run import footprint

    moved = footprint.moved(state.clean_footprint, state.original_reference)
    if moved:  # (a library loaded, a class patched, a weight edited: anything)
        result.notes.append(
            "the gradients over budget were not measured against the reference's own "
            f"rounding noise: what it computes with moved since it was taken clean ({moved[0]})")
    return not moved


def _forward_fails(state: DiffState) -> bool:
    """The forward fails already: the diff fails whatever the gradients' budgets, and its
    backward's gradients are carried from the forward's fault (not judged again: a FAIL's
    cost stays one backward a side)."""
    from introspect.diff.records import STATUS_FAIL as FORWARD_FAIL

    evidence = state.module_evidence
    return (state.verdict is not None and not state.verdict.passed) \
        or any(r.status == FORWARD_FAIL for r in state.rows) \
        or (evidence is not None and not evidence.passed)


def _noise(state: DiffState, inputs: Any, loss_fn: Any, reference_gradients: Any,
           failing: Any) -> Any:
    """Each reference gradient's rounding noise: its float32 gradient against a float64
    copy's (``backward.parity.gradient_noise``), per node and per parameter; None where
    the copy cannot run (said on ``failing``, whose FAIL then stands)."""
    from introspect.diff.backward.parity import gradient_noise

    try:
        return gradient_noise(state.original_reference, state.candidate, copies(inputs),
                              loss_fn, {}, reference_gradients)
    except InputError as e:
        failing.notes.append("the gradients over budget could not be measured against the "
                             f"reference's own rounding noise ({e})")
        return None


def _own_against_noise(state: DiffState) -> Any:
    """The own backwards' FAIL judged again with each weight's budget at least
    ``noise_factor`` times the reference's rounding noise of its gradient: a gradient that
    cancels to nearly nothing (a key's weight: softmax ignores a shift) is as noisy as the
    terms it sums, not as its size. What it proves then: a PASS, the FAIL (weights still
    over), or None (the weights within noise, the rest unproven: the recorded path, where
    there is one, decides; else the FAIL stands, said so)."""
    own = state.own_gradients
    failing = own.failing
    if failing is None or not _noise_allowed(state, failing):
        return failing
    from introspect.diff.backward.plain_parity import judge_plain_gradients

    noise = _noise(state, state.ref_accepted, state.loss[1], state.ref_plain, failing)
    if noise is None:
        return failing
    again = judge_plain_gradients(
        state.loss[0], state.ref_plain, state.cand_plain, state.module_evidence,
        state.reference, state.tolerance, state.tensors.get("attention_mask"),
        state.options.budgets.allow_nonfinite, noise=noise)
    factor = f"{state.tolerance.noise_factor:g}x"
    if again.failing is not None:
        again.failing.notes.append(
            "judged again against the reference's own rounding noise, measured in float64 "
            f"(each weight's budget at least {factor} it): still over")
        return again.failing
    over = sum(r.status == STATUS_FAIL for r in failing.parameter_rows)
    said = (f"{over} weight gradient(s) over the default budget (atol x the gradient's "
            "magnitude) are within the reference's own rounding noise, measured in float64 "
            f"(each budget at least {factor} it)")
    if again.result is not None:
        again.result.notes.append(said)
        return again.result
    if state.explanation.graph is not None:
        return None  # (the recorded path decides)
    failing.notes.append(f"{said}; but {again.why}: the own backwards prove no PASS")
    return failing


def _recorded_against_noise(state: DiffState, failing: Any) -> Any:
    """The recorded backward's FAIL judged again, the candidate's backward recorded once
    more, each gradient's budget at least ``noise_factor`` times the reference's own
    rounding noise (as ``noise_budget`` gives it, measured only where the defaults fail)."""
    if not _noise_allowed(state, failing) or state.ref_gradients is None:
        return failing
    from introspect.diff.backward import backward_diff
    from introspect.diff.backward.parity import backward_loss

    explanation, mode = state.explanation, state.options.mode
    ref_inputs = state.ref_side[1]
    _, loss_fn = backward_loss(state.original_reference, copies(ref_inputs), mode.loss,
                               state.loss_inputs or {})
    noise = _noise(state, ref_inputs, loss_fn, state.ref_gradients, failing)
    if noise is None:
        return failing
    again = backward_diff(
        state.original_reference, state.candidate, copies(ref_inputs),
        copies(explanation.cand_inputs or {}),
        explanation.alignment, state.ref_side[0], explanation.graph, state.tolerance,
        loss=mode.loss, attention_mask=state.tensors.get("attention_mask"),
        forward_status={r.reference_node: r.status for r in state.rows
                        if r.reference_node and r.candidate_node},
        allow_nonfinite=state.options.budgets.allow_nonfinite,
        reference_gradients=state.ref_gradients, loss_inputs=state.loss_inputs, noise=noise)
    failed = sum(r.status == STATUS_FAIL for r in failing.rows) + \
        sum(r.status == STATUS_FAIL for r in failing.parameter_rows)
    noise_said = (" the reference's own rounding noise, measured in float64, each budget at "
                  f"least {state.tolerance.noise_factor:g}x it")
    if failed:
        again.notes.append(
            f"{failed} gradient(s) were over the default budget (atol x the gradient's "
            "magnitude); " + ("each is within" if again.passed else "judged again against")
            + noise_said)
    else:  # (failed between its rows: a gradient changed between aligned ops)
        again.notes.append("the backward was judged again against" + noise_said
                           + ("" if again.passed else ", and fails there too"))
    return again


def _check_loss(loss: Any) -> None:
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be a callable loss(outputs, inputs) -> scalar, got "
                         f"{type(loss).__name__}")


__all__ = ["candidate_own_backward", "compare_gradients", "gradients_now",
           "held_to_own_backward", "one_forward_for_both", "own_backward", "own_gradients_late"]
