"""Position ids offset: the divergence is an index tensor, not a float a block computes.

When the first divergent node holds integers that count 0, 1, 2, ... along their last dim
(the positions a model looks up; recognised by value, not by name), and the candidate's
integers are the reference's plus one constant everywhere, the candidate starts counting
its positions elsewhere (HF's RoBERTa offsets them by the padding index; a port copying
that into BERT is off by that much). The hint names the reference's module that takes the
positions (its position or rotary embeddings, found on a run of the reference), since the
node where they first differ may sit outside any layer (HF's decoders make them next to
the mask).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from introspect.diff.hypotheses.context import DivergenceContext
from introspect.diff.hypotheses.site import model_kwargs


def hints(context: DivergenceContext) -> list[str]:
    """A hint when the candidate's positions are the reference's shifted by a constant."""
    reference, candidate = context.reference_value, context.candidate_value
    if (reference.is_floating_point() or candidate.is_floating_point()
            or reference.shape != candidate.shape or reference.numel() == 0
            or not _counts_up(reference)):
        return []
    shift = candidate.long() - reference.long()
    first = int(shift.reshape(-1)[0])
    if first == 0 or not bool((shift == first).all()):
        return []
    consumer = position_consumer(context.reference_model, context.inputs, reference.shape[-1])
    where = f"taken by {consumer}" if consumer else f"at {context.reference_node}"
    return [f"the candidate's position ids are offset by {first:+d}: the reference's position "
            f"ids ({where}) count from 0, the candidate's from {first} (every id differs by "
            f"exactly {first:+d})"]


def position_consumer(model: torch.nn.Module, inputs: Mapping[str, Any], length: int) -> str:
    """The first module (in call order) of a run of ``model`` that takes the positions
    0, 1, ..., ``length`` - 1 as an argument: its position or rotary embeddings, e.g.
    "wpe (Embedding)"; "" when none does. Where a position offset should be blamed."""
    found: list[str] = []
    handles = []

    def hook(name: str) -> Callable[..., None]:
        def record(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            values = [*args, *kwargs.values()]
            if not found and any(isinstance(v, torch.Tensor) and not v.is_floating_point()
                                 and v.dim() >= 1 and v.shape[-1] == length and _counts_up(v)
                                 for v in values):
                found.append(f"{name} ({type(_).__name__})")
        return record

    for name, module in model.named_modules():
        if name:  # the root takes the inputs, not the positions it makes
            handles.append(module.register_forward_pre_hook(hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(**model_kwargs(model, inputs))
    except (TypeError, RuntimeError, ValueError):
        return ""
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else ""


def _counts_up(values: torch.Tensor) -> bool:
    """Whether every row along the last dim is 0, 1, 2, ..."""
    steps = torch.arange(values.shape[-1], dtype=torch.long)
    return bool((values.long() == steps).all())

__all__ = ["hints", "position_consumer"]
