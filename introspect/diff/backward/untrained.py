"""Weights the reference trains that the candidate holds where no gradient reaches: in a
buffer (registered with ``register_buffer``, not as a ``Parameter``) or in a parameter
with ``requires_grad`` off. Its forward agrees, and no gradient of it is ever compared
(weights are paired among parameters that take one), so such a port passed ``--backward``
though a step of its training leaves that weight where it was (probe round m).

Each is a failing weight row: its gradient in the candidate is none (zero), the
reference's is not.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.backward.parity import _sgd_step_error
from introspect.diff.backward.plain import PlainGradients
from introspect.diff.backward.results import ParameterGradient
from introspect.diff.records import STATUS_FAIL


def never_trained(reference: PlainGradients, candidate: PlainGradients,
                  relations: Mapping[str, set[str]]) -> list[ParameterGradient]:
    """A failing row for each reference weight with a gradient (not all zero) that a
    candidate buffer or frozen parameter holds, and no trained parameter of it does
    (``relations``: each candidate parameter -> the reference weights it holds)."""
    trained = {r for name, held in relations.items() if name not in candidate.frozen
               for r in held}
    holders: dict[str, tuple[str, str]] = {}
    for name in candidate.frozen:
        held = relations.get(name, set())
        if len(held) == 1:
            holders.setdefault(next(iter(held)), (name, "a parameter with requires_grad off"))
    for name, value in candidate.buffers.items():
        for ref_name, weight in reference.parameters.items():
            if ref_name not in holders and _holds(value, weight):
                holders[ref_name] = (name, "a buffer, not a Parameter")
    rows = []
    for ref_name, (name, how) in holders.items():
        g_ref = reference.parameter_grads.get(ref_name)
        if ref_name in trained or g_ref is None or not bool((g_ref != 0).any()):
            continue
        weight = reference.parameters[ref_name]
        scale = float(g_ref.abs().max())
        step = _sgd_step_error(weight, g_ref, weight, torch.zeros_like(g_ref))
        hint = (f"the candidate holds {ref_name} in {name}, {how}: no gradient reaches it, "
                "and a step of training leaves it where it was, where the reference's "
                "gradient is not zero")
        rows.append(ParameterGradient(ref_name, name, "held untrained", str(tuple(g_ref.shape)),
                                      scale, 1.0, scale, step, STATUS_FAIL, hint))
    order = list(reference.parameters)
    return sorted(rows, key=lambda r: order.index(r.reference))


def _holds(value: torch.Tensor, weight: torch.Tensor) -> bool:
    """``value`` is ``weight``, as it is or transposed, and the weight is no constant (a
    zero bias equals every zero buffer)."""
    if value.numel() != weight.numel() or value.numel() < 2 or value.dtype != weight.dtype:
        return False
    flat = weight.reshape(-1)
    if bool((flat == flat[0]).all()):
        return False
    return value.shape == weight.shape and torch.equal(value, weight) or \
        weight.ndim == 2 and value.shape == weight.t().shape and torch.equal(value, weight.t())


__all__ = ["never_trained"]
