"""Real tokens, and whether a decoder's variant reproduces the candidate there.

A port may compute anything at padded positions (nanoGPT's attention has no padding mask
at all; HF hides padded keys but still computes the padded queries), and those values
reach no real token. A hypothesis is therefore judged on every position first and, when
that fails, on the real tokens alone, with the reference's own mask: the diff's
``attention_mask``, or every token real where the inputs hold none (HF then passes
``attention_mask=None`` to its attention modules and lets sdpa apply the causal mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def real_tokens(inputs: Mapping[str, Any]) -> torch.Tensor | None:
    """(B, S) bool: True at real tokens; every token when the inputs hold no mask."""
    ids = inputs.get("input_ids")
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return mask.bool()
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return torch.ones(ids.shape, dtype=torch.bool)
    return None


def causal_mask(keep: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) bool: each query sees the real keys up to itself (HF's decoder mask)."""
    S = keep.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return causal[None, None] & keep[:, None, None, :]


def real_in(shape: torch.Size, keep: torch.Tensor) -> torch.Tensor:
    """Where ``keep``'s real tokens lie in a value of ``shape``, the decoders' layouts:
    (B, nh, S, hd) (heads first, as the re-run steps keep them), (B, S, ...) or rows
    flattened (B·S, F). Every position when the shape is none of them."""
    B, S = keep.shape
    if len(shape) == 4 and shape[0] == B and shape[2] == S:
        where = keep[:, None, :, None]
    elif len(shape) >= 2 and tuple(shape[:2]) == (B, S):
        where = keep.reshape(B, S, *([1] * (len(shape) - 2)))
    elif len(shape) == 2 and shape[0] == B * S:
        where = keep.reshape(B * S, 1)
    else:
        return torch.ones(shape, dtype=torch.bool)
    return where.expand(shape)


def budget(candidate: torch.Tensor, real: torch.Tensor, atol: float, rtol: float) -> float:
    """The diff's budget at the candidate's largest real value (at least 1e-5)."""
    values = candidate[real].abs()
    largest = float(values.max()) if values.numel() else 0.0
    return max(atol + rtol * largest, 1e-5)


def max_abs(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> float:
    """Max abs difference of ``a`` and ``b`` at ``where`` (0 where nothing is selected)."""
    diff = (a.double() - b.double()).abs()
    selected = diff[where]
    return float(selected.max()) if selected.numel() else 0.0


def reproduces(value: torch.Tensor, base: torch.Tensor, candidate: torch.Tensor,
               real: torch.Tensor, budget: float) -> tuple[float, float, bool] | None:
    """(error, base error, at real tokens only) when ``value`` reproduces ``candidate``
    within ``budget`` and at least ten times better than ``base``; None otherwise."""
    everywhere = torch.ones(candidate.shape, dtype=torch.bool)
    for where, real_only in ((everywhere, False), (real, True)):
        error, base_error = max_abs(value, candidate, where), max_abs(base, candidate, where)
        if error <= budget and error * 10 < base_error:
            return error, base_error, real_only
    return None


def sentence(what: str, how: str, found: tuple[float, float, bool]) -> str:
    """The hint for a reproduced variant, saying when padded positions were left out."""
    error, base_error, real_only = found
    where = ", at real tokens; padding positions left out" if real_only else ""
    return (f"{what}: {how} reproduces the candidate's values (max abs error {error:.2g} vs "
            f"{base_error:.2g} unmodified{where})")
