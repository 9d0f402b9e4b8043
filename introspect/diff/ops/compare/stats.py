"""The errors of one pair: a candidate value measured against its reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from introspect.diff.histogram import error_histogram, exact_histogram
from introspect.diff.records import ErrorStats
from introspect.diff.tolerance import Budget


def measure(candidate: torch.Tensor, reference: torch.Tensor, budget: Budget,
            pad: torch.Tensor | None, *, known_finite: bool = False) -> tuple[ErrorStats, bool]:
    """Errors of ``candidate`` against ``reference`` (same shape), and whether they are equal.

    A mismatch is an element with ``|cand - ref| > atol + rtol * |ref|``, or a NaN on one
    side only; relative errors skip elements where the reference is 0. ``known_finite``
    spares the NaN/Inf count when the caller knows the value holds none.
    """
    real_count = _real_count(reference.shape, pad)
    if candidate.dtype == reference.dtype and torch.equal(candidate, reference):
        nonfinite = 0 if known_finite else _nonfinite(candidate)
        return ErrorStats(0.0, 0.0, 0.0, 0, nonfinite, real_count, 0.0, 0, nonfinite,
                          histogram=exact_histogram(real_count)), True
    reference_nonfinite = _nonfinite(reference)
    dtype = torch.promote_types(candidate.dtype, reference.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float64
    a, b = candidate.to(dtype), reference.to(dtype)
    d = (a - b).abs()
    if bool(d.isnan().any()):
        d = d.masked_fill((a == b) | (a.isnan() & b.isnan()), 0.0).nan_to_num(nan=float("inf"))
    magnitude = b.abs()
    over = d > (budget.atol + budget.rtol * magnitude)
    rel = d / magnitude.masked_fill(magnitude == 0, float("inf"))
    if pad is None:
        stats = ErrorStats(_max(d), float(d.double().mean()) if d.numel() else 0.0, _max(rel),
                           int(over.sum()), _nonfinite(candidate), real_count, 0.0, 0,
                           reference_nonfinite, _max(magnitude.nan_to_num(posinf=0.0)),
                           error_histogram(d, None), _sqnr_db(b, d))
        return stats, False
    d_real = d.masked_fill(pad, 0.0)
    stats = ErrorStats(
        max_abs=_max(d_real),
        mean_abs=float(d_real.double().sum()) / real_count if real_count else 0.0,
        max_rel=_max(rel.masked_fill(pad, 0.0)),
        mismatched=int((over & ~pad).sum()),
        nonfinite=_nonfinite(candidate),
        elements=real_count,
        pad_max_abs=_max(d.masked_fill(~pad, 0.0)),
        pad_mismatched=int((over & pad).sum()),
        reference_nonfinite=reference_nonfinite,
        reference_max_abs=_max(magnitude.nan_to_num(posinf=0.0).masked_fill(pad, 0.0)),
        histogram=error_histogram(d, pad),
        sqnr_db=_sqnr_db(b.masked_fill(pad, 0.0), d_real),
    )
    return stats, False


def _sqnr_db(reference: torch.Tensor, error: torch.Tensor) -> float:
    """Signal to quantization noise in dB, as Numeric Suite reports it:
    ``10 log10(sum ref^2 / sum (cand - ref)^2)``; inf for no error, -inf for no signal."""
    noise = float(error.double().square().sum())
    if noise == 0.0:
        return math.inf
    signal = float(reference.double().nan_to_num(posinf=0.0, neginf=0.0).square().sum())
    if signal == 0.0 or math.isinf(noise) or math.isnan(noise):
        return -math.inf
    return 10 * math.log10(signal / noise)


def _max(t: torch.Tensor) -> float:
    return float(t.max()) if t.numel() else 0.0


def _nonfinite(t: torch.Tensor) -> int:
    # One reduction answers for almost every tensor: the sum is finite when all values are
    # (a sum that overflows is rechecked element by element).
    if not t.is_floating_point() or t.numel() == 0 or bool(torch.isfinite(t.sum())):
        return 0
    return int((~torch.isfinite(t)).sum())


def _real_count(shape: Sequence[int], pad: torch.Tensor | None) -> int:
    total = 1
    for s in shape:
        total *= s
    if pad is None:
        return total
    # Each element of the broadcast mask stands for total / pad.numel() elements.
    return total - int(pad.sum()) * (total // pad.numel())
