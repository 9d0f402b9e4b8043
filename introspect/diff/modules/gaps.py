"""The largest gap between two values, as float64 copies of both give it, read without them.

Module evidence measures ``max |a - b|`` thousands of times (each pairing's candidates, each
local error and its noise); copying both sides to float64 first cost most of that time. Each
difference of two float32 values rounded to float32 is within a relative 2^-24 of the exact
one (float16 and bfloat16 widen to float32 exactly), so every element whose float64
difference can be the largest is among those within a hair (``_NEAR_TOP``) of the largest
float32 difference: those few are read again in float64, and their largest is the figure
of the float64 copies, exactly. The float32 pass decides nothing on its own: a largest that
is not finite, or so small that the relative bound fails (subnormals), or a flushing CPU
(``torch.set_flush_denormal``) where every difference reads 0, takes the float64 copies.

Example::

    >>> largest_gap(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 2.75]))
    0.5
"""

from __future__ import annotations

import math

import torch

# Elements whose float32 difference is this close to the largest are read in float64. Rounding
# is monotonic, so the element whose exact difference is the largest has the largest float32
# difference (ties included); the margin keeps it where subnormal inputs read as 0 too.
_NEAR_TOP = 1 - 2.0**-16
# A largest float32 difference below this may be subnormal, where rounding is absolute.
_SMALLEST = 2.0**-100
_WIDENED = (torch.float32, torch.float16, torch.bfloat16)
_CHUNK = 4096  # elements whose largest difference is taken at once
# Values this large on either side are a mask's filler (-1e4, finfo.min, -inf), each
# side's own: left out of the comparison, as padding is.
_FILLER = 1e20


def largest_gap(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """``max |a - b|`` over the elements ``keep`` marks (flat; all where None), as float64
    copies of both give it (NaN where one is NaN; 0.0 where none is kept)."""
    quick = _read_in_float32(a, b, keep)
    if quick is not None:
        return quick
    gaps = (_kept_in_float64(a, keep) - _kept_in_float64(b, keep)).abs()
    return float(gaps.max()) if gaps.numel() else 0.0


def largest(t: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """``max |t|`` over ``keep``, whose elements are finite (abs and max are exact in any
    float dtype: no float64 copy); 0.0 where none is kept."""
    magnitudes = flat(t).abs()
    if keep is not None:
        magnitudes.masked_fill_(~keep, 0.0)
    return float(magnitudes.max()) if magnitudes.numel() else 0.0


def mean_gap(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """The mean of ``|a - b|`` over the elements ``keep`` marks, in float64 (0.0 where none
    is kept). Read only by the float64 checks (``precise``), a few times a diff."""
    gaps = (_kept_in_float64(a, keep) - _kept_in_float64(b, keep)).abs()
    return float(gaps.mean()) if gaps.numel() else 0.0


def mean_magnitude(t: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """The mean of ``|t|`` over ``keep``, in float64 (0.0 where none is kept)."""
    magnitudes = _kept_in_float64(t, keep).abs()
    return float(magnitudes.mean()) if magnitudes.numel() else 0.0


def _kept_in_float64(t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """The elements of ``t`` that ``keep`` marks (all where None), flat, a float64 copy."""
    t = t.detach().double().cpu().reshape(-1)
    return t if keep is None else t[keep]


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, flat, in float32 or float64: each value as it was (no copy of a
    float32 or float64 tensor there already)."""
    t = t.detach().cpu().reshape(-1)
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def kept(reference: torch.Tensor, candidate: torch.Tensor,
          real: torch.Tensor | None) -> torch.Tensor:
    """Elements compared: real tokens, finite and not a mask's filler on both sides."""
    # (in float32 or float64, as ``gaps.flat`` holds them: no float32 value lies between
    # _FILLER and its float32 rounding, so the test is the float64 copies')
    r, c = flat(reference), flat(candidate)
    keep = torch.isfinite(r) & torch.isfinite(c) & (r.abs() < _FILLER) & (c.abs() < _FILLER)
    shape = reference.shape
    if real is not None and len(shape) >= 2 and tuple(shape[:2]) == tuple(real.shape):
        tokens = (real.cpu() != 0).reshape(*real.shape, *([1] * (len(shape) - 2)))
        keep = keep & tokens.expand(shape).reshape(-1)
    return keep


def _read_in_float32(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor | None,
                     ) -> float | None:
    if a.dtype not in _WIDENED or b.dtype not in _WIDENED or a.numel() != b.numel() \
            or a.numel() == 0:
        return None
    a32, b32 = flat(a), flat(b)
    gaps = torch.sub(a32, b32).abs_()
    if keep is not None:
        gaps.masked_fill_(~keep, 0.0)
    whole = gaps.numel() // _CHUNK * _CHUNK
    tops = gaps[:whole].view(-1, _CHUNK).amax(1)  # each chunk's largest (NaN where one is)
    if whole < gaps.numel():
        tops = torch.cat([tops, gaps[whole:].max().reshape(1)])
    top = float(tops.max())
    if not math.isfinite(top):
        return None
    if top == 0.0:  # every difference exact, hence none (no flushing: x - y = 0 only at x = y)
        return 0.0 if _gradual_underflow() else None
    if top < _SMALLEST:
        return None
    near = top * _NEAR_TOP  # (the few chunks that hold such elements are searched: one or two)
    found = [(gaps[c * _CHUNK:(c + 1) * _CHUNK] >= near).nonzero().reshape(-1) + c * _CHUNK
             for c in (tops >= near).nonzero().reshape(-1).tolist()]
    index = torch.cat(found)
    return float((a32[index].double() - b32[index].double()).abs().max())


def _gradual_underflow() -> bool:
    """This thread's CPU keeps subnormal results (``torch.set_flush_denormal`` is off)."""
    return bool(torch.tensor([2.0**-126]) / 2 != 0)


__all__ = ["flat", "kept", "largest", "largest_gap", "mean_gap", "mean_magnitude"]
