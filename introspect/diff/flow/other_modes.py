"""A candidate whose plain calls part by grad mode, recorded again in the mode its
recording did not reproduce, so that op evidence sees the path each call took.

The op-level recording runs under ``no_grad`` (``ops.eager.record_forward``). A forward may
branch on ``torch.is_grad_enabled()`` or ``torch.is_inference_mode_enabled()``; where its
call with autograd on, or under ``inference_mode``, returns other bits than the recording,
the nodes of that recording say nothing about the path that call took, and a fault there
that moves the outputs by less than their budget would pass on the outputs alone (a port
with no modules of its own leaves module evidence only its outputs too). So the candidate
is recorded once more in that mode and replayed beside the reference's recording: where
that recording reproduces the call bit for bit and a node there is over its budget, the
FAIL stands on its rows. The reference's recording stands for its own call in that mode
only where that call returned the recording's bits (else nothing is recorded again).

Only where the candidate's calls differ by mode: the others pay nothing. Not with
``--backward``, whose recording runs with autograd on and carries the gradients.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import torch

from introspect.diff.flow.op_level import explain_with, take_rows
from introspect.diff.flow.state import DiffState
from introspect.diff.ops.eager import record_forward
from introspect.run.outputs import flatten_outputs
from introspect.run.truth import AUTOGRAD, INFERENCE_MODE, Truth, identical

_SAID = {AUTOGRAD: "with autograd on", INFERENCE_MODE: "under torch.inference_mode()"}


def explain_other_modes(state: DiffState) -> None:
    """Record the candidate again in each grad mode whose plain call its recording did not
    reproduce, and take that recording's rows where they fail. After
    ``hold_recordings_to_truth``."""
    explanation = state.explanation
    if not state.truths or state.options.mode.backward or state.random \
            or explanation is None or explanation.graph is None or not state.faithful \
            or not state.explained_passed or state.ref_side is None:
        return
    recorded = flatten_outputs(explanation.recording.recorded_outputs)
    ref_recorded = flatten_outputs(state.ref_side[2].recorded_outputs)
    for mode in _modes_not_reproduced(state.cand_truth, recorded):
        if not _reference_stands(state.ref_truth, ref_recorded, mode,
                                 state.options.budgets.noise_budget):
            state.notes.append(f"the candidate's call {_SAID[mode]} takes another path than "
                               "its recording, and so does the reference's: that call is "
                               "judged on its outputs and module evidence")
            continue
        again = explain_with(state, None, functools.partial(record_forward, mode=mode))
        if again.graph is None or again.recording is None:
            continue
        call = state.cand_truth.outputs_of(mode)
        if call is None or not _reproduces(flatten_outputs(again.recording.recorded_outputs),
                                           call):
            state.notes.append(f"the candidate's call {_SAID[mode]} takes another path than "
                               "its recording, and a recording in that mode does not "
                               "reproduce it either: that call is judged on its outputs and "
                               "module evidence")
            continue
        failing = again.divergence is not None
        state.notes.append(
            f"the candidate's call {_SAID[mode]} takes another path than its no_grad call "
            f"(its outputs differ bit for bit): recorded again {_SAID[mode]} and replayed "
            "beside the reference's recording, "
            + ("where a node parts (below)" if failing else "every pair within its budget there"))
        if failing:  # the path only that call took holds the fault: its rows decide
            state.explanation = again
            state.notes += [n for n in again.notes if n not in state.notes]
            said = "under inference_mode" if mode == INFERENCE_MODE else "with autograd on"
            where = (f"on the path its call {_SAID[mode]} takes, recorded again there: its "
                     f"forward changes {said} here")
            divergence = dataclasses.replace(again.divergence, detail="; ".join(
                d for d in (again.divergence.detail, where) if d))
            take_rows(state, again.rows, divergence)
            return


def _modes_not_reproduced(truth: Truth, recorded: Mapping[str, torch.Tensor]) -> list[str]:
    """The grad modes (autograd on, inference mode) whose call returned other bits than the
    recording, where the ``no_grad`` call is the one it reproduced."""
    if not _reproduces(recorded, truth.no_grad_outputs):
        return []
    return [mode for mode in (AUTOGRAD, INFERENCE_MODE)
            if (outputs := truth.outputs_of(mode)) is not None
            and not _reproduces(recorded, outputs)]


def _reference_stands(truth: Truth, recorded: Mapping[str, torch.Tensor], mode: str,
                      noise_budget: bool) -> bool:
    """Whether the reference's recording stands for its call in ``mode``: that call (its
    ``no_grad`` one for inference mode, which it is not called in) returned the same bits
    as its ``no_grad`` call, and, where not recorded in float64, as its recording."""
    same = _reproduces(truth.no_grad_outputs, truth.grad_outputs) if mode == AUTOGRAD else True
    return same and (noise_budget or _reproduces(recorded, truth.no_grad_outputs))


def _reproduces(recorded: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
    return bool(outputs) and all(name in recorded and identical(recorded[name], value)
                                 for name, value in outputs.items())


__all__ = ["explain_other_modes"]
