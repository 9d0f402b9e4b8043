"""Module evidence's largest gaps (``introspect.diff.modules.gaps``) read without float64
copies are the copies' own figures, bit for bit: near ties, mixed dtypes, NaN, inf, values
that overflow float32 when subtracted, subnormals, kept elements, nothing kept."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

gaps = importlib.import_module("introspect.diff.modules.gaps")
pairing = importlib.import_module("introspect.diff.modules.pairing")


def _copies(a, b, keep=None) -> float:
    """What float64 copies of both give (the code before ``gaps``)."""
    g = (a.double().reshape(-1) - b.double().reshape(-1)).abs()
    if keep is not None:
        g = g[keep]
    return float(g.max()) if g.numel() else 0.0


def _same(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def _pairs(seed: int):
    generator = torch.Generator().manual_seed(seed)
    for i in range(60):
        n = int(torch.randint(1, 500, (), generator=generator))
        a = torch.randn(n, generator=generator) * 10.0 ** (i % 40 - 20)
        yield a, a * (1 + 1e-7 * torch.randn(n, generator=generator))  # near ties
        yield a, a + 0.75  # one offset: every gap a tie in float32, not in float64
        yield a, (a * (1 + 1e-3)).half().float()  # another dtype's rounding
        yield a.bfloat16(), a.half()  # two dtypes below float32
        yield a, torch.nextafter(a, torch.full_like(a, math.inf))  # one ulp
        yield a, a.clone()


@pytest.mark.parametrize("kept", [False, True])
def test_the_largest_gap_is_the_float64_copies(kept):
    generator = torch.Generator().manual_seed(1)
    for a, b in _pairs(0):
        keep = torch.rand(a.numel(), generator=generator) > 0.3 if kept else None
        assert _same(gaps.largest_gap(a, b, keep), _copies(a, b, keep)), (a, b)


def test_non_finite_overflowing_subnormal_and_empty_gaps_are_the_copies():
    big = torch.tensor([3e38, -3e38, 1.0])  # 6e38: inf in float32, finite in float64
    tiny = torch.tensor([2.0**-149, 2.0**-140, 0.0])
    cases = [(big, -big), (tiny, torch.zeros(3)), (tiny, tiny * 3),
             (torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0])),
             (torch.tensor([math.inf, 1.0]), torch.tensor([math.inf, 1.5])),
             (torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 1.0])),
             (torch.zeros(0), torch.zeros(0))]
    for a, b in cases:
        assert _same(gaps.largest_gap(a, b), _copies(a, b)), (a, b)
    none_kept = torch.zeros(3, dtype=torch.bool)
    assert gaps.largest_gap(big, -big, none_kept) == 0.0


def test_pairings_distance_keeps_its_finite_rule():
    a = torch.tensor([1.0, math.inf, 3.0, math.nan])
    b = torch.tensor([1.5, math.inf, 2.0, 1.0])
    assert pairing.distance(a, b) == 1.0  # the finite elements on both sides
    assert pairing.distance(torch.tensor([math.nan]), torch.tensor([1.0])) == math.inf
    assert pairing.distance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 0.0
