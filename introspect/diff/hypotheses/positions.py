"""Position ids offset: the divergence is an index tensor, not a float a block computes.

When the first divergent node holds integers that count 0, 1, 2, ... along their last dim
(the positions a model looks up; recognised by value, not by name), and the candidate's
integers are the reference's plus one constant everywhere, the candidate starts counting
its positions elsewhere (HF's RoBERTa offsets them by the padding index; a port copying
that into BERT is off by that much).
"""

from __future__ import annotations

import torch

from introspect.diff.hypotheses.context import DivergenceContext


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
    return [f"the candidate's position ids are offset by {first:+d}: the reference counts "
            f"positions from 0 at {context.reference_node}, the candidate from {first} "
            f"(every id differs by exactly {first:+d})"]


def _counts_up(values: torch.Tensor) -> bool:
    """Whether every row along the last dim is 0, 1, 2, ..."""
    steps = torch.arange(values.shape[-1], dtype=torch.long)
    return bool((values.long() == steps).all())
