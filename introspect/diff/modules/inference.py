"""Module evidence for a branch taken under ``torch.inference_mode()`` only.

The capture keeps the calls with autograd on and under ``no_grad`` (inference tensors have
no version counters to prove a value unchanged), so a port that branches on
``torch.is_inference_mode_enabled()`` is judged there by its outputs alone, with their
loose budget: a LayerNorm eps fault taken only in inference mode moved bert-tiny's outputs
by 6e-6 and PASSED. Where the candidate's outputs under inference mode are not its other
calls' bit for bit (a correct port's are: the same kernels on the same values), the
smallest module that does not reproduce its own output run again in inference mode
(``reproduced.first_unreproduced``) is found; it, or its nearest ancestor that module
evidence judged with a budget, is run on the reference's inputs under inference mode and
held to that budget (the rounding of its own ops does not depend on the grad mode).

Example::

    >>> row = judged_under_inference(calls, pairs, rows, mask)
    >>> row.call, row.status
    ('inference_mode', 'fail')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from introspect.diff.modules.budget import FLOOR_UNITS, module_budget, unit_of
from introspect.diff.modules.local import NotRerun, inference_local
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.modules.paths import depth, within
from introspect.diff.modules.reproduced import first_unreproduced
from introspect.diff.records import STATUS_FAIL, STATUS_OK
from introspect.run.capture import ModuleCall
from introspect.run.truth import INFERENCE_MODE

# ``gather_module_evidence(changing=...)``: the outputs under inference mode pass, yet are
# not the other calls' bit for bit
INFERENCE_DIFFERS = "inference_differs"


def judged_under_inference(calls: Sequence[ModuleCall], pairs: Sequence[ModulePair],
                           rows: Sequence[Any], real: torch.Tensor | None,
                           rounding: Sequence[str] = ()) -> Any:
    """The row (an ``evidence.ModuleDiff``, which imports this module) of the module that
    holds the inference-mode branch, judged there (None: no module changes under
    inference mode, or none holding it has a budget)."""
    found = first_unreproduced(calls, inference=True)
    if found is None:
        return None
    call = found[0]
    holding = sorted((p for p in pairs if within(call.name, p.call.name)),
                     key=lambda p: -depth(p.call.name))
    for pair in holding:
        row = next((r for r in rows if r.candidate_module == pair.call.name
                    and r.status == STATUS_OK and r.max_abs_err is not None), None)
        if row is None:
            continue
        output = next(leaf.value for leaf in pair.call.outputs if leaf.path == pair.output.path)
        unit = unit_of(pair.call.module, output, pair.output.boundary.value, rounding)
        try:
            local = inference_local(pair, unit, real, floor=FLOOR_UNITS * unit)
        except NotRerun:
            return None
        budget = module_budget(pair.call.module, local, unit, pair.inputs[0].boundary.value)
        return dataclasses.replace(
            row, call=INFERENCE_MODE, max_abs_err=local.max_abs, noise=local.noise,
            limit=budget.limit, status=STATUS_OK if local.max_abs <= budget.limit
            else STATUS_FAIL,
            note=(f"run on the reference's inputs under inference_mode, where its output "
                  f"changes (its outputs there are not its other calls'); {budget.why}"))
    return None


__all__ = ["INFERENCE_DIFFERS", "judged_under_inference"]
