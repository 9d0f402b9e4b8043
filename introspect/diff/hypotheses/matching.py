"""Which quantity a divergent node holds, and whether a variant reproduces the candidate.

The reference node is identified *by value*: among a block's recomputed intermediates, the
one that equals the node's output in some layout (as computed, split into heads
(B, S, nh, hd), or heads first (B, nh, S, hd)). A hypothesis holds when its variant of the
block, brought to that layout, matches the candidate's value within budget and much
better than the unmodified block does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

Layout = Callable[[torch.Tensor], torch.Tensor]
_HUGE = 1e30  # masked scores hold the dtype's minimum; leave them out of scales
_SLACK = 8.0  # times the diff's budget: a recomputation's rounding, not a bug
_BETTER = 0.1  # a variant must cut the unmodified block's error at least tenfold


@dataclass(frozen=True)
class Quantity:
    """A named intermediate of a block, and how to bring it to the node's layout."""

    name: str
    layout: Layout
    real: torch.Tensor  # bool, in the node's layout: positions of real (unpadded) tokens


@dataclass(frozen=True)
class Verdict:
    """How well a variant reproduces the candidate's value."""

    error: float  # max abs error of the variant against the candidate
    base_error: float  # the unmodified block's max abs error against the candidate
    real_only: bool  # reproduced at real tokens only (padding positions left out)


def _layouts(value: torch.Tensor, heads: int) -> list[tuple[str, Layout]]:
    options: list[tuple[str, Layout]] = [("as is", lambda t: t)]
    if value.dim() == 3 and value.shape[-1] % heads == 0:
        B, S, H = value.shape
        options.append(("heads", lambda t: t.reshape(B, S, heads, H // heads)))
        options.append(("heads first",
                        lambda t: t.reshape(B, S, heads, H // heads).transpose(1, 2)))
    return options


def _real_positions(name: str, value: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """True where the value belongs to a real token (its query's, for attention maps)."""
    if value.dim() == 4:  # (B, nh, S, S): the query axis
        return keep[:, None, :, None].expand(value.shape)
    if value.dim() == 3 and value.shape[:2] == keep.shape:
        return keep[:, :, None].expand(value.shape)
    if value.dim() == 3 and value.shape[0] == 1:  # position embeddings (1, S, H)
        return torch.ones(value.shape, dtype=torch.bool)
    return torch.ones(value.shape, dtype=torch.bool)


def _scale(t: torch.Tensor) -> float:
    finite = t[t.abs() < _HUGE].abs()
    return float(finite.max()) if finite.numel() else 0.0


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding of recomputing a block another way."""
    if a.shape != b.shape:
        return False
    a, b = a.double(), b.double()
    tol = 1e-4 * (b.abs() + _scale(b) * 1e-2 + 1e-3)
    return bool(((a - b).abs() <= tol).all())


def identify(reference_value: torch.Tensor, intermediates: Mapping[str, torch.Tensor],
             keep: torch.Tensor, heads: int) -> Quantity | None:
    """The intermediate (and layout) that the reference node holds, or None."""
    for name, value in intermediates.items():
        for _, layout in _layouts(value, heads):
            try:
                laid = layout(value)
            except RuntimeError:
                continue
            if same(laid, reference_value.detach()):
                return Quantity(name, layout, layout(_real_positions(name, value, keep)))
    return None


def _max_abs(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> float:
    diff = (a.double() - b.double()).abs()
    diff = torch.where(where, diff, torch.zeros_like(diff))
    return float(diff.max()) if diff.numel() else 0.0


def judge(variant: torch.Tensor, base: torch.Tensor, candidate: torch.Tensor,
          quantity: Quantity, atol: float, rtol: float) -> Verdict | None:
    """A Verdict when ``variant`` reproduces ``candidate`` (all positions, else real ones)."""
    candidate = candidate.detach()
    if variant.shape != candidate.shape:
        return None
    everywhere = torch.ones(candidate.shape, dtype=torch.bool)
    for where, real_only in ((everywhere, False), (quantity.real, True)):
        error = _max_abs(variant, candidate, where)
        base_error = _max_abs(base, candidate, where)
        bound = _SLACK * (atol + rtol * candidate.double().abs())
        within = (variant.double() - candidate.double()).abs() <= bound
        if bool(within[where].all()) and error <= _BETTER * base_error:
            return Verdict(error, base_error, real_only)
    return None
