"""Which quantity a divergent node holds, and whether a variant reproduces the candidate.

The reference node is identified *by value*: among a block's recomputed intermediates, the
one that equals the node's output in some layout (as computed, split into heads
(B, S, nh, hd), or heads first (B, nh, S, hd)). A hypothesis holds when its variant of the
block, brought to that layout, matches the candidate's value within budget and much
better than the unmodified block does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from introspect.diff.modules.gaps import flat, largest_gap

Layout = Callable[[torch.Tensor], torch.Tensor]
_HUGE = 1e30  # masked scores hold the dtype's minimum; leave them out of scales
SLACK = 8.0  # times the diff's budget: a recomputation's rounding, not a bug
BETTER = 0.1  # a variant must cut the unmodified block's error at least tenfold


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


class Judge:
    """Whether variants of a block reproduce the candidate's value: what every variant is
    held against (the unmodified block's error, the budget) is measured once.

    ``slack``, ``better``: ``SLACK`` and ``BETTER``; looser ones, with ``base_within``
    False (the unmodified block is known to be out of budget), only pick the hypotheses
    worth running on every row (``hypotheses._pruned``).

    A variant is read in float32, as the block computes it: each element's gap to the
    candidate is held against the budget's float32 margins (``_margins``), and only the
    elements between them are read again in float64; the error is ``largest_gap``'s. The
    verdicts are those of float64 copies of both, exactly.
    """

    def __init__(self, base: torch.Tensor, candidate: torch.Tensor, quantity: Quantity,
                 atol: float, rtol: float, slack: float = SLACK, better: float = BETTER,
                 base_within: bool | None = None):
        self.candidate = candidate.detach().double()
        self.shape = candidate.shape
        self.bound = slack * (atol + rtol * self.candidate.abs())
        self.better = better
        self.base_gap = (base.double() - self.candidate).abs()
        self._candidate, self._flat64 = flat(candidate), self.candidate.reshape(-1)
        self._bound = self.bound.reshape(-1)
        self._margins = _margins(self._bound) if _in_float32(candidate) else None
        everywhere = torch.ones(self.candidate.numel(), dtype=torch.bool)
        base_gap, real = self.base_gap.reshape(-1), quantity.real.reshape(-1)
        self.wheres = []  # (flat where, real_only, the base's error there, the base within)
        for where, real_only in ((everywhere, False), (real, True)):
            self.wheres.append((where, real_only, _max_of(base_gap, where),
                                bool((base_gap <= self._bound)[where].all())
                                if base_within is None else base_within))

    def __call__(self, variant: torch.Tensor) -> Verdict | None:
        """A Verdict when ``variant`` reproduces the candidate (all positions, else real
        ones): within budget where the unmodified block is not, and at least tenfold
        closer."""
        if variant.shape != self.shape:
            return None
        if self._margins is None or not _in_float32(variant):
            return self._in_float64(variant)
        variant = flat(variant)
        gap = torch.sub(variant, self._candidate).abs_()  # float32, as rounded
        under, over = self._margins
        beyond = gap > over  # out of budget in float64 too
        for where, real_only, base_error, base_within in self.wheres:
            if base_within or not self._within(variant, gap <= under, beyond, where):
                continue
            error = largest_gap(variant, self._candidate, where)
            if error <= self.better * base_error:
                return Verdict(error, base_error, real_only)
        return None

    def _within(self, variant: torch.Tensor, inside: torch.Tensor, beyond: torch.Tensor,
                where: torch.Tensor) -> bool:
        """``|variant - candidate| <= bound`` at every element ``where`` marks, as float64
        copies give it: the elements the float32 margins leave undecided (neither
        ``inside`` nor ``beyond`` them) are read again in float64."""
        if bool((beyond & where).any()):
            return False
        undecided = (~inside & where).nonzero().reshape(-1)
        again = (variant[undecided].double() - self._flat64[undecided]).abs()
        return bool((again <= self._bound[undecided]).all())

    def _in_float64(self, variant: torch.Tensor) -> Verdict | None:
        """The verdict on float64 copies of both whole values (a float64 value)."""
        gap = (variant.double() - self.candidate).abs().reshape(-1)
        within = gap <= self._bound
        for where, real_only, base_error, base_within in self.wheres:
            if base_within or not bool(within[where].all()):
                continue
            error = _max_of(gap, where)
            if error <= self.better * base_error:
                return Verdict(error, base_error, real_only)
        return None


# A float32 gap g32 is the exact gap d rounded (|g32 - d| <= 2^-24 d where d is a normal
# float32; float16 and bfloat16 widen to float32 exactly); its float64 copy g64 is within
# 2^-53 d. A margin 2^-20 of the bound b wide covers both roundings and the margins' own:
# g32 <= under (b >= 2^-100) gives g64 <= b; g32 > over gives g64 > b (an infinite g32
# included: d is then past float32's largest, over is not). Below 2^-100, where subnormals
# round absolutely (or flush to 0), ``under`` is -inf and ``over`` 2^-99: those elements are
# read in float64 unless clearly over. NaN gaps or bounds are never decided in float32.
_MARGIN = 2.0**-20
_TINY = 2.0**-100
_FLOAT32_TOP = 2.0**127  # margins clamped below float32's largest: they stay finite


def _margins(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 margins of the bound ``b``: a gap at most the first is within it, a gap
    above the second is not (as float64 copies say); between them the verdict is unsure."""
    under = torch.where(b >= _TINY, (b * (1 - _MARGIN)).clamp(max=_FLOAT32_TOP), -math.inf)
    over = torch.where(b * (1 + _MARGIN) < _FLOAT32_TOP,
                       (b * (1 + _MARGIN)).clamp(min=2 * _TINY), math.inf)
    return under.float(), over.float()


def _in_float32(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _max_of(gap: torch.Tensor, where: torch.Tensor) -> float:
    gap = torch.where(where, gap, torch.zeros_like(gap))
    return float(gap.max()) if gap.numel() else 0.0


def judge(variant: torch.Tensor, base: torch.Tensor, candidate: torch.Tensor,
          quantity: Quantity, atol: float, rtol: float) -> Verdict | None:
    """A Verdict when ``variant`` reproduces ``candidate`` (all positions, else real ones)."""
    return Judge(base, candidate, quantity, atol, rtol)(variant)
