"""The reference's side of the flow: placed, its plain calls (the truth) and what its
modules saw, its recording (clean, in float64, or only where a PASS needs it), and the
checks that the candidate left it unchanged."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from introspect.diff import devices
from introspect.diff.copies import cast_copy
from introspect.diff.flow.gradients import (
    gradients_now,
    held_to_own_backward,
    one_forward_for_both,
    own_backward,
)
from introspect.diff.flow.state import DiffState, compiled, copies
from introspect.diff.ops.align import align_graphs
from introspect.diff.ops.compare.replay import run_side_by_side
from introspect.diff.ops.eager import record_forward
from introspect.diff.ops.explain import accepted_inputs, record_for_diff
from introspect.diff.tolerance import Budget
from introspect.errors import InputError
from introspect.run import footprint, switches
from introspect.run.capture import capture_calls
from introspect.run.reference import ReferenceChanged, check_reference_again
from introspect.run.spill import hold_budget
from introspect.run.truth import run_truth


def place_models(state: DiffState) -> None:
    """Both models moved where they are asked to run, and the reference's inputs there.
    First, inside the ``try`` that puts them back: a candidate handed over ``Deferred`` is
    built now only when devices are asked for; otherwise it waits for the reference's
    truth (``build_candidate``)."""
    device, candidate_device = state.options.devices.device, state.options.devices.candidate_device
    if state.deferred is not None and (device is not None or candidate_device is not None):
        state.candidate, state.deferred = state.deferred.build(), None  # both models move together
    if state.deferred is None:
        state.placement = devices.place(state.reference, state.candidate, device,
                                        candidate_device)
    state.ref_tensors = copies(devices.to_device(state.tensors, state.placement.reference_device
                                                 if state.placement else
                                                 devices.model_device(state.reference)))


def take_reference_truth(state: DiffState) -> None:
    """The reference's plain calls and what each of its modules saw in them: what the
    candidate is judged against, taken before the candidate exists."""
    # The reference first, clean: its truth and its recording come before the
    # candidate's code is imported or built (``introspect.run.deferred``).
    reference = state.reference
    state.ref_accepted = accepted_inputs(reference, state.ref_tensors)
    state.later = _left_for_later(state)
    backward = own_backward(state, reference) if state.later and state.options.mode.backward \
        else None
    # (past a budget of about the reference's weights, what they saw goes to disk)
    with capture_calls(reference, gradients=backward is not None,
                       hold_bytes=hold_budget(reference)) as ref_calls:
        # module evidence: what each module saw (and, with backward, was handed)
        state.ref_truth = run_truth(reference, state.ref_accepted, lean=not compiled(reference),
                                    backward=backward) if state.truths else None
    state.ref_calls = ref_calls


def _left_for_later(state: DiffState) -> bool:
    """Without node tables asked for, the reference is recorded only where a PASS is not
    proven without it, after checking it still computes what it did clean (with backward,
    its own backward taken clean proves a PASS's gradients: ``backward.plain``)."""
    options = state.options
    return not options.tables.nodes and state.truths and options.mode.recordings is None \
        and not (options.mode.backward and options.budgets.noise_budget) \
        and options.devices.device is None and options.devices.candidate_device is None


def record_reference_clean(state: DiffState) -> None:
    """The reference's op-level recording, still clean (before the candidate is built),
    unless a PASS may need none or the reference is to run in float64; with backward, its
    gradients too. Where it is left for later, what it computes with is read now."""
    options, reference = state.options, state.reference
    # With backward, one forward per side recorded with autograd on serves both
    # comparisons; the reference's backward runs now, before the candidate is built
    # (left for later: its own backward was taken clean, ``own_backward``).
    state.gradients_with = one_forward_for_both(state)
    # What the reference computes with, read before the candidate's build and calls: a
    # PASS proven without running the reference after them calls it again only where
    # something it reads moved (``run.footprint``; the call adds no evidence there).
    state.before_candidate = footprint.take(reference) if state.later else None
    state.clean_footprint = state.before_candidate or (
        footprint.take(reference) if options.mode.backward and not options.budgets.noise_budget
        else None)
    state.ref_side = None if options.budgets.noise_budget or state.later else \
        record_for_diff(reference, copies(state.ref_tensors), state.reference_label,
                        state.keywords[0], state.recorded_already[0],
                        state.gradients_with or record_forward)
    if state.gradients_with is not None and state.ref_side is not None:
        gradients_now(state)


def measure_noise_budget(state: DiffState) -> None:
    """With ``noise_budget``: the reference in float64 becomes the one recorded, and each of
    its nodes' noise in the candidate's dtype its budget. Once the candidate is built (its
    dtype and device are the noise's), before its calls."""
    state.reference, state.noise = _measure_noise(state.reference, state.candidate,
                                                  state.tensors)
    state.notes.append("the reference ran in float64; each node's budget is at least "
                       f"{state.tolerance.noise_factor:g}x its own noise in the candidate's "
                       "dtype")
    state.ref_side = record_for_diff(
        state.reference, devices.to_device(state.tensors, devices.model_device(state.reference)),
        state.reference_label, state.keywords[0])


def record_reference_late(state: DiffState) -> None:
    """The reference's recording, where it was left for later and a PASS needs it after
    all: first the reference called again, proving the candidate's calls left it as it was
    (the recording would otherwise record what they left behind)."""
    if state.ref_side is not None:
        return
    assert state.ref_truth is not None
    reference_again(state)  # what the candidate's calls left behind
    state.ref_side = record_for_diff(state.reference, copies(state.ref_tensors),
                                     state.reference_label, state.keywords[0],
                                     recorder=state.gradients_with or record_forward)
    if state.gradients_with is not None:
        gradients_now(state)
        if state.ref_plain is not None:  # its backward, now, as it was clean
            held_to_own_backward(state)


def reference_again_where_moved(state: DiffState) -> None:
    """The last check that the candidate left the reference as it was: where what the
    reference computes with was read before the candidate's build (``state.later``) and
    none of it moved since, calling it again adds no evidence (``run.footprint``: its
    weights, attributes, classes, globals, torch's functions, kernels, libraries and
    environment); otherwise it is called again (``reference_again``)."""
    if state.before_candidate is None:
        reference_again(state)
        return
    state.reference_now = footprint.take(state.original_reference)
    if footprint.differences(state.before_candidate, state.reference_now):
        reference_again(state)


def reference_again(state: DiffState) -> None:
    """``check_reference_again`` on the caller's reference, its message naming the switches
    the candidate's build flipped."""
    switched = state.switched
    try:
        check_reference_again(state.original_reference, state.ref_accepted, state.ref_truth)
    except InputError as e:
        if not switched:
            raise
        what = "which moves the reference's outputs" if isinstance(e, ReferenceChanged) \
            else "and the reference cannot run under it (" + \
            str(e).split(": ", 1)[-1].split(". ")[0].rstrip(".") + ")"
        raise ReferenceChanged(
            f"the {state.candidate_label}'s build switched {switches.describe(switched)} "
            f"process-wide, {what}: no verdict") from e


def _measure_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                   tensors: Mapping[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, float]]:
    """The reference in float64, and each of its nodes' noise in the candidate's dtype."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()), torch.float32)
    exact = cast_copy(reference, torch.float64, what="noise_budget").eval()
    # on the candidate's device: its kernels (TF32, sdpa's flash) are the noise to measure
    where = devices.model_device(candidate)
    rounded = cast_copy(reference, dtype, what="noise_budget",
                        always=where != devices.model_device(reference)).to(where).eval()
    ref_graph, ref_inputs, _ = record_for_diff(
        exact, devices.to_device(tensors, devices.model_device(exact)), "float64")
    low_graph, low_inputs, _ = record_for_diff(rounded, devices.to_device(tensors, where),
                                               str(dtype))
    alignment = align_graphs(ref_graph, low_graph)
    unlimited = [Budget(math.inf, 0.0)] * len(alignment.pairs)
    run = run_side_by_side(ref_graph.gm, low_graph.gm, alignment.pairs, unlimited,
                           ref_inputs, low_inputs, snapshots=0)
    noise: dict[str, float] = {}
    for i, pair in enumerate(alignment.pairs):
        stats = run.local.get(i)
        if stats is not None:
            noise[pair.reference] = max(noise.get(pair.reference, 0.0), stats.max_abs)
    return exact, noise


__all__ = ["measure_noise_budget", "place_models", "record_reference_clean",
           "record_reference_late", "reference_again", "reference_again_where_moved",
           "take_reference_truth"]
