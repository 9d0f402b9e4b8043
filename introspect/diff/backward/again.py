"""A model's forward run again, for what its backward let go.

The backward diff keeps neither side's values nor autograd graph past its backward
(memory). Two things need them again: a layout fitted on both values, and the local
backwards of a failing gradient. ``run_again`` makes them once more, from the random
generators' state the first forward began in, and checks it is the same run.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.backward.record import GradientRecording, outputs_by_name, run_forward
from introspect.run.random_state import random_state_of
from introspect.run.reference import ReferenceChanged
from introspect.run.truth import identical


def run_again(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
              first: GradientRecording) -> GradientRecording | None:
    """``model``'s forward once more, recorded with autograd on, its graph kept: the values
    and autograd functions its first backward let go, beside that backward's gradients.
    None where it is not the same run: other nodes or ops, or outputs not equal to the bit.
    """
    with random_state_of(first.random_state):  # dropout draws what it drew
        run = run_forward(model, inputs)
    run.recorder.unhook()  # no backward runs on it: a local backward calls each function
    outputs = outputs_by_name(run.outputs)
    moved = [name for name, value in first.outputs.items() if isinstance(value, torch.Tensor)
             and not identical(value, outputs.get(name))]
    if run.recorder.targets != first.node_targets or moved:
        return None
    recorder = run.recorder
    return GradientRecording(recorder.values, first.grads, recorder.requires_grad,
                             first.parameter_grads, first.parameters, first.loss,
                             first.outputs, first.node_targets, recorder.tensors,
                             recorder.edges, first.detached, first.shells,
                             recomputed=set(first.recomputed))


def reference_again(reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                    first: GradientRecording) -> GradientRecording:
    """``run_again`` for the reference. It runs after the candidate was built, so a
    reference that computes otherwise then is no reference.

    Raises:
        ReferenceChanged: it is not the same run (the candidate changed what the
            reference computes).
    """
    found = run_again(reference, inputs, first)
    if found is None:
        raise ReferenceChanged(
            "the candidate changed what the reference computes (run again, it ran other ops "
            "or its outputs moved: a patched torch function or kernel?); no verdict")
    return found


__all__ = ["reference_again", "run_again"]
