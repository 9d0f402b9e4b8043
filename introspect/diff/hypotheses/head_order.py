"""Attention heads concatenated in another order: found by value, then tested.

A port that loops over its heads and concatenates them in another order (reversed, or a
permutation a wrong ``permute`` leaves) holds, at the merged context (B, S, H), each of
the reference's heads whole, at another head's place. Which head went where is read off
the values: each of the candidate's head blocks is matched with the reference head whose
values it holds (``matching.same``, at real tokens). Where every block holds exactly one
reference head, and not all at their own place, the reference's context with its heads so
reordered is judged like any hypothesis (``matching.Judge``): within budget, and far
better than the unmodified block."""

from __future__ import annotations

import torch

from introspect.diff.hypotheses.matching import Judge, Quantity, same

CONTEXT = "context"  # the block's merged attention output (B, S, H), before its dense


def head_order_hints(base: dict[str, torch.Tensor], quantity: Quantity,
                     candidate: torch.Tensor, keep: torch.Tensor, heads: int,
                     judge: Judge) -> list[str]:
    """The hint where the candidate's context holds the reference's heads in another
    order ([] where it does not, or the divergence is not at the context as computed)."""
    if quantity.name != CONTEXT:
        return []
    context = base[CONTEXT]
    if context.dim() != 3 or context.shape[-1] % heads or candidate.shape != context.shape \
            or not torch.equal(quantity.layout(context), context):
        return []
    order = _order(context, candidate.detach(), keep, heads)
    if order is None:
        return []
    B, S, H = context.shape
    reordered = context.reshape(B, S, heads, H // heads)[:, :, order].reshape(B, S, H)
    verdict = judge(quantity.layout(reordered))
    if verdict is None:
        return []
    said = "reversed" if order == list(range(heads))[::-1] else ", ".join(
        f"head {j} holds the reference's head {i}" for j, i in enumerate(order) if i != j)
    return [f"the candidate concatenates the attention heads in another order ({said}): "
            f"reordering the reference's heads reproduces the candidate's values (max abs "
            f"error {verdict.error:.2g} vs {verdict.base_error:.2g} unmodified)"]


def _order(context: torch.Tensor, candidate: torch.Tensor, keep: torch.Tensor,
           heads: int) -> list[int] | None:
    """For each of the candidate's heads, the one reference head whose values it holds
    at real tokens; None unless that is a permutation other than the identity."""
    B, S, H = context.shape
    real = keep.bool()
    ours = context.reshape(B, S, heads, H // heads)[real]  # (real tokens, nh, hd)
    theirs = candidate.reshape(B, S, heads, H // heads)[real]
    order = []
    for j in range(heads):
        held = [i for i in range(heads) if same(theirs[:, j], ours[:, i])]
        if len(held) != 1:
            return None
        order.append(held[0])
    if sorted(order) != list(range(heads)) or order == list(range(heads)):
        return None
    return order


__all__ = ["head_order_hints"]
