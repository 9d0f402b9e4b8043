"""How a candidate value lines up with its reference: layouts, feature orders, regions.

A pair's values may hold the same numbers in another arrangement: reshaped and permuted
(``Layout``, ``fit_layouts``: ``(B*S, H)`` for ``(B, S, H)``, heads before tokens), with
features in another order (a permuted weight: ``inverse_order``, ``block_orders``), or as
one part of a fused value (``narrow`` to a pair's region).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch

from introspect.diff.ops.compare.axes import TOKENS

_MAX_LAYOUT_DIMS = 5  # permutations tried when two paired values differ by layout


class Layout:
    """Maps a candidate value to the reference's layout and back: reshaped to the
    reference's axes in the order ``perm``, then permuted (``(B*S, H)`` for ``(B, S, H)``);
    or, ``permute_first``, its own axes permuted by ``perm``, then reshaped (``(B, nh, S,
    hd)`` for ``(B, S, H)``: heads before tokens, their features split)."""

    def __init__(self, perm: tuple[int, ...], cand_shape: tuple[int, ...],
                 ref_shape: tuple[int, ...], permute_first: bool = False) -> None:
        self.perm = perm
        self.inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
        self.cand_shape, self.ref_shape = cand_shape, ref_shape
        self.permute_first = permute_first
        self.shaped = [cand_shape[p] for p in perm] if permute_first \
            else [ref_shape[p] for p in perm]
        # (a key apart: ``proven`` remembers layouts by this, the two kinds never alike)
        self.key: tuple[object, ...] = ("permute first", *perm) if permute_first else perm

    def to_reference(self, value: torch.Tensor) -> torch.Tensor:
        if self.permute_first:
            return value.permute(self.perm).reshape(self.ref_shape)
        return value.reshape(self.shaped).permute(self.inverse)

    def to_candidate(self, value: torch.Tensor) -> torch.Tensor:
        if self.permute_first:
            return value.reshape(self.shaped).permute(self.inverse)
        return value.permute(self.perm).reshape(self.cand_shape)

    def __str__(self) -> str:
        identity = self.perm == tuple(range(len(self.perm)))
        if self.permute_first:
            return f"permute {self.perm} and reshape"
        return "reshape" if identity else f"reshape and permute {self.perm}"


def fit_layouts(candidate: torch.Tensor, reference: torch.Tensor,
                pad: torch.Tensor | None = None, *,
                permutes_only: bool = False) -> list[tuple[float, Layout]]:
    """Every reshape + permute of ``candidate`` to ``reference``'s shape, and every
    permute + reshape where the shapes differ, best fit first.

    The fit is the mean absolute difference over real tokens (``pad`` True at padding);
    ties keep the order of ``itertools.permutations``, the identity first.
    ``permutes_only``: only the layouts that permute whole axes (for two values of one
    shape: only axes of equal sizes can have traded places).
    """
    cand_shape, ref_shape = tuple(candidate.shape), tuple(reference.shape)
    if candidate.numel() != reference.numel() or len(ref_shape) > _MAX_LAYOUT_DIMS:
        return []
    fits: list[tuple[float, Layout]] = []
    target = reference.double()
    for layout in _layouts(cand_shape, ref_shape, permutes_only):
        d = (layout.to_reference(candidate).double() - target).abs()
        if pad is not None:
            d = d.masked_fill(pad, 0.0)
        error = float(d.mean()) if d.numel() else 0.0
        fits.append((0.0 if math.isnan(error) else error, layout))
        if error == 0.0:
            break
    return sorted(fits, key=lambda fit: fit[0])


def _layouts(cand_shape: tuple[int, ...], ref_shape: tuple[int, ...],
             permutes_only: bool) -> Iterator[Layout]:
    """The layouts ``fit_layouts`` tries, in its order: reshaped to the reference's axes
    in every order (the identity first), then, where the shapes differ, the candidate's
    own axes in every other order, then reshaped."""
    for perm in itertools.permutations(range(len(ref_shape))):
        layout = Layout(perm, cand_shape, ref_shape)
        if not permutes_only or tuple(layout.shaped) == cand_shape:
            yield layout
    if not permutes_only and cand_shape != ref_shape and len(cand_shape) <= _MAX_LAYOUT_DIMS:
        for perm in list(itertools.permutations(range(len(cand_shape))))[1:]:
            yield Layout(perm, cand_shape, ref_shape, permute_first=True)


def fit_layout(candidate: torch.Tensor, reference: torch.Tensor) -> Layout | None:
    """The reshape + permute that brings ``candidate`` closest to ``reference``, if any."""
    fits = fit_layouts(candidate, reference)
    return fits[0][1] if fits else None


def may_trade(perm: tuple[int, ...], labels: tuple[str | None, ...] | None) -> bool:
    """Whether two values of one shape may differ by ``perm``: never by trading two token
    axes (queries and keys of attention scores: a transposed score matrix is a bug, q and k
    swapped), nor, where the axes are unknown, the last two axes of a square value."""
    if labels is None or len(labels) != len(perm):
        n = len(perm)
        return n < 2 or not (perm[n - 1] == n - 2 and perm[n - 2] == n - 1)
    return all(not (labels[k] == TOKENS and labels[p] == TOKENS) or p == k
               for k, p in enumerate(perm))


def inverse_order(order: torch.Tensor) -> torch.Tensor:
    """The order that undoes ``order``: candidate features put back in the reference's."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


_MOST_ROWS = 16  # batches up to this many rows are tried in another order, each row
# against each
_SAMPLED = 4096  # elements of each row compared to find the order


def fit_row_order(candidate: torch.Tensor, reference: torch.Tensor,
                  pad: torch.Tensor | None) -> tuple[torch.Tensor, float, float] | None:
    """The order of the candidate's batch rows (its first axis) among the reference's:
    candidate row k is reference row ``order[k]`` (a port that sorts its rows by length,
    or runs them reversed, computes each value row for row in its own order). Returns
    (order, the largest gap in that order, the largest in the rows' own), or None where
    the rows are in their own order already, or no one-to-one order is nearest, or the
    batch is of one row or of more than ``_MOST_ROWS``. ``pad``: the reference's padded
    elements, left out (a row's padded positions are any port's own)."""
    rows = reference.shape[0] if reference.ndim >= 2 else 0
    if candidate.shape != reference.shape or not 2 <= rows <= _MOST_ROWS \
            or not candidate.is_floating_point():
        return None
    # each candidate row against each reference row on a sample of its elements (a
    # batch of 8 x 128 x 768 is 64 row pairs), then the order found measured in full
    return _nearest_order(candidate.reshape(rows, -1), reference.reshape(rows, -1),
                          None if pad is None else ~pad.expand(reference.shape).reshape(rows, -1),
                          _SAMPLED, 1)


_SIGNATURE = 64  # elements of each token compared to find the tokens' order
_TOKENS_AT_ONCE = 64  # reference tokens measured against every candidate token at a time


def fit_token_order(candidate: torch.Tensor, reference: torch.Tensor,
                    pad: torch.Tensor | None,
                    axis: int) -> tuple[torch.Tensor, float, float] | None:
    """The order of the candidate's tokens (along ``axis``) among the reference's, as
    ``fit_row_order`` finds batch rows': a port that runs its sequence back to front
    computes each value token for token at the mirrored place. Each token is first
    matched on a sample of ``_SIGNATURE`` of its elements, the order found then measured
    in full. None where the tokens are in their own order already, or no one-to-one order
    is nearest (tokens alike, a token-type embedding's: the replay then tries the
    orders other values of the run proved)."""
    tokens = reference.shape[axis] if reference.ndim else 0
    if candidate.shape != reference.shape or tokens < 2:
        return None
    real = None if pad is None else \
        ~pad.expand(reference.shape).movedim(axis, 0).reshape(tokens, -1)
    return _nearest_order(candidate.movedim(axis, 0).reshape(tokens, -1),
                          reference.movedim(axis, 0).reshape(tokens, -1), real, _SIGNATURE,
                          _TOKENS_AT_ONCE)


def _nearest_order(mine: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor | None,
                   sample: int, at_once: int) -> tuple[torch.Tensor, float, float] | None:
    """``fit_row_order``'s and ``fit_token_order``'s search, on their ``(n, elements)``
    views: each candidate entry (row k) matched to the reference entry nearest it on
    ``sample`` of its elements, ``at_once`` reference entries measured at a time; the
    order so found measured in full. ``real``: the reference's real elements (None:
    all). None where the entries keep their own order or no one-to-one order is
    nearest."""
    n = theirs.shape[0]
    every = max(1, mine.shape[1] // sample)
    sampled, target = mine[:, ::every].double(), theirs[:, ::every].double()
    nearest: list[torch.Tensor] = []
    for start in range(0, n, at_once):  # (candidate entries, a few reference entries)
        block = slice(start, start + at_once)
        gap = (sampled[:, None, :] - target[None, block, :]).abs().nan_to_num(math.inf)
        if real is not None:
            gap = gap.masked_fill(~real[None, block, ::every], 0.0)
        nearest.append(gap.amax(dim=2))
    order = torch.cat(nearest, dim=1).argmin(dim=1)  # (candidate entry -> reference entry)
    own = torch.arange(n, device=order.device)
    if torch.equal(order, own) or torch.unique(order).numel() != n:
        return None
    return order, _rows_gap(mine, theirs.index_select(0, order), real, order), \
        _rows_gap(mine, theirs, real, own)


ROWS_ORDER, TOKENS_ORDER = "rows", "tokens"


@dataclasses.dataclass(frozen=True)
class AxisOrder:
    """A candidate value's batch rows or tokens in another order: index k along each of
    ``axes`` holds the reference's index ``order[k]`` (rows sorted by length or run
    reversed; a sequence run back to front, whose attention scores hold it on two axes)."""

    kind: str  # ROWS_ORDER or TOKENS_ORDER
    axes: tuple[int, ...]
    order: torch.Tensor

    def to_candidate(self, reference: torch.Tensor) -> torch.Tensor:
        for axis in self.axes:
            reference = reference.index_select(axis, self.order.to(reference.device))
        return reference

    def to_reference(self, value: torch.Tensor) -> torch.Tensor:
        inverse = inverse_order(self.order).to(value.device)
        for axis in self.axes:
            value = value.index_select(axis, inverse)
        return value

    def fits(self, value: torch.Tensor) -> bool:
        return all(axis < value.ndim and value.shape[axis] == self.order.numel()
                   for axis in self.axes)

    def __str__(self) -> str:
        order = self.order.tolist()
        if order == list(range(len(order) - 1, -1, -1)):
            return f"{self.kind} in reverse order"
        shown = order if len(order) <= 16 else [*order[:16], "..."]
        return f"{self.kind} in another order: {shown}".replace("'...'", "...")


def _rows_gap(mine: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor | None,
              order: torch.Tensor) -> float:
    """The largest gap of each candidate row to the reference row ``order`` pairs it with,
    at the reference row's real elements."""
    gap = (mine.double() - theirs.double()).abs().nan_to_num(math.inf)
    if real is not None:
        gap = gap.masked_fill(~real.index_select(0, order), 0.0)
    return float(gap.max())


def block_orders(order: tuple[int, ...]) -> set[tuple[int, ...]]:
    """``order`` and, where it permutes each block of ``b`` features the same way, the
    order within one block (a head's features after the head split)."""
    found = {order}
    n = len(order)
    for block in range(2, n):
        if n % block or any(order[j] // block != j // block for j in range(n)):
            continue
        inner = tuple(order[j] % block for j in range(block))
        if all(order[j] % block == inner[j % block] for j in range(n)):
            found.add(inner)
    return found


def narrow(value: torch.Tensor, region: Any) -> torch.Tensor:
    """The part of a fused value that one pair compares (a pair's ``Region``)."""
    return value.narrow(region.dim, region.start, region.stop - region.start)
