"""Dropout left active: the candidate gives different outputs on two runs in eval mode."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.hypotheses.site import model_kwargs


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def hints(candidate: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> list[str]:
    """One hint when two runs of the candidate on the same inputs differ."""
    was_training = candidate.training
    candidate.eval()
    try:
        with torch.no_grad():
            state = torch.random.get_rng_state()
            try:
                first = _tensors(candidate(**model_kwargs(candidate, inputs)))
                second = _tensors(candidate(**model_kwargs(candidate, inputs)))
            except (TypeError, RuntimeError, ValueError):  # it cannot run on these inputs
                return []
            finally:
                torch.random.set_rng_state(state)  # leave the caller's random stream alone
    finally:
        candidate.train(was_training)
    pairs = zip(first, second, strict=False)
    gaps = [float((a.double() - b.double()).abs().max()) for a, b in pairs
            if a.shape == b.shape and a.is_floating_point()]
    if gaps and max(gaps) > 0:
        return [f"dropout is active in the candidate: two runs in eval mode on the same inputs "
                f"differ by up to {max(gaps):.3g} (a dropout applied whatever the mode, e.g. "
                "F.dropout(..., training=True) or scaled_dot_product_attention's dropout_p)"]
    return []
