"""Dropout left active: the candidate gives different outputs on two runs in eval mode,
and its weights did not move between them (a forward that edits its weights is named so)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.hypotheses.site import model_kwargs
from introspect.diff.records import WEIGHT_EDIT
from introspect.models.ports import describe_changes
from introspect.run.modes import set_mode
from introspect.run.truth import edited_weights, weight_sums


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def hints(candidate: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> list[str]:
    """One hint when two runs of the candidate on the same inputs differ (the batch's first
    row: a dropout draws per element, and a row is a fraction of a forward's cost)."""
    rows = {t.shape[0] for t in inputs.values() if isinstance(t, torch.Tensor) and t.dim()}
    if len(rows) == 1 and rows != {1}:
        row = {k: v[:1] if isinstance(v, torch.Tensor) and v.dim() else v
               for k, v in inputs.items()}
        found = _two_runs(candidate, row)
        if found is not None:
            return found
    return _two_runs(candidate, inputs) or []


def _two_runs(candidate: torch.nn.Module,
              inputs: Mapping[str, torch.Tensor]) -> list[str] | None:
    """The hint from two runs on ``inputs``; None where the candidate cannot run on them."""
    was_training = candidate.training
    device = next((t.device for t in candidate.parameters()), None)
    if device is not None:  # the candidate may run on a device of its own (--candidate-device)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in inputs.items()}
    set_mode(candidate, False)
    try:
        with torch.no_grad():
            state = torch.random.get_rng_state()
            sums = weight_sums(candidate)
            try:
                first = _tensors(candidate(**model_kwargs(candidate, inputs)))
                second = _tensors(candidate(**model_kwargs(candidate, inputs)))
            except (TypeError, RuntimeError, ValueError):  # it cannot run on these inputs
                return None
            finally:
                torch.random.set_rng_state(state)  # leave the caller's random stream alone
            edited = edited_weights(sums, weight_sums(candidate))
    finally:
        set_mode(candidate, was_training)
    if edited:  # two runs differ because the weights moved, not through a dropout
        return [f"{WEIGHT_EDIT} ({describe_changes(edited, most=3)}): they change on "
                "every call (e.g. weight.data *= ... or an in-place update in forward)"]
    pairs = zip(first, second, strict=False)
    gaps = [float((a.double() - b.double()).abs().max()) for a, b in pairs
            if a.shape == b.shape and a.is_floating_point()]
    if gaps and max(gaps) > 0:
        return [f"dropout is active in the candidate: two runs in eval mode on the same inputs "
                f"differ by up to {max(gaps):.3g} (a dropout applied whatever the mode, e.g. "
                "F.dropout(..., training=True) or scaled_dot_product_attention's dropout_p)"]
    return []


def zeroed_and_scaled(reference: torch.Tensor, candidate: torch.Tensor,
                      real: torch.Tensor) -> tuple[float, float] | None:
    """(fraction zeroed, scale) when ``candidate`` is ``reference`` with some values set to 0
    and every other one multiplied by one factor above 1 (a dropout's ``1 / (1 - p)``), at
    the ``real`` positions; None otherwise."""
    if reference.shape != candidate.shape or not reference.is_floating_point() \
            or not candidate.is_floating_point():
        return None
    r, c = reference.double()[real], candidate.double()[real]
    if r.numel() < 8:
        return None
    largest = float(r.abs().max())
    live = r.abs() > 1e-6 * largest  # a zero in the reference says nothing
    r, c = r[live], c[live]
    zeroed = c == 0
    if not bool(zeroed.any()) or int((~zeroed).sum()) < 2:
        return None
    scale = float((c[~zeroed] / r[~zeroed]).median())
    if not 1.0 + 1e-3 < scale < 1e3:
        return None
    slack = 1e-4 * scale * (r[~zeroed].abs() + 1e-2 * largest)  # rounding, as in matching
    if not bool(((c[~zeroed] - scale * r[~zeroed]).abs() <= slack).all()):
        return None
    return float(zeroed.double().mean()), scale


def value_hints(reference: torch.Tensor, candidate: torch.Tensor, real: torch.Tensor,
                module: str) -> list[str]:
    """One hint when the candidate's values are the reference's through an active dropout."""
    found = zeroed_and_scaled(reference, candidate, real)
    if found is None:
        return []
    fraction, scale = found
    p = 1.0 - 1.0 / scale
    where = f" at {module}" if module else ""
    return [f"dropout is active in the candidate{where}: its values are the reference's with "
            f"{fraction:.1%} of them zeroed and every other one multiplied by {scale:.4g} = "
            f"1/(1 - {p:.3g}), a dropout with p = {p:.3g} applied in eval mode (e.g. "
            "F.dropout(..., training=True), or a Dropout left in training mode)"]
