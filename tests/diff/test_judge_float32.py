"""The hypotheses' judge (``matching.Judge``) reads variants in float32 and gives the
verdicts float64 copies of both values give, bit for bit: gaps at the budget's edge, NaN,
inf, masked scores (the dtype's minimum), padding, lower dtypes, subnormals, and every
hypothesis of a few real faults."""

from __future__ import annotations

import importlib

import pytest
import torch

from introspect.diff.hypotheses.hypothesis import run_base
from introspect.diff.hypotheses.matching import Judge, Quantity, Verdict, identify
from introspect.diff.hypotheses.site import locate
from tests.diff.test_hypotheses import QUANTITY, context_for
from tests.ports.batch import port_batch

hypotheses = importlib.import_module("introspect.diff.hypotheses")


def _copies(judge: Judge, variant: torch.Tensor) -> Verdict | None:
    """What float64 copies of both values give (the judge before it read float32)."""
    if variant.shape != judge.shape:
        return None
    gap = (variant.double() - judge.candidate).abs().reshape(-1)
    within = gap <= judge.bound.reshape(-1)
    for where, real_only, base_error, base_within in judge.wheres:
        if base_within or not bool(within[where].all()):
            continue
        error = float(torch.where(where, gap, torch.zeros_like(gap)).max())
        if error <= judge.better * base_error:
            return Verdict(error, base_error, real_only)
    return None


def _quantity(shape, padded: int) -> Quantity:
    real = torch.ones(shape, dtype=torch.bool)
    if padded:
        real[:, -padded:] = False
    return Quantity("x", lambda t: t, real)


def _at_the_edge(candidate: torch.Tensor, bound: torch.Tensor, generator) -> torch.Tensor:
    """The candidate moved by about its bound, each element a little inside or outside."""
    nudge = 1 + 1e-7 * torch.randint(-3, 4, candidate.shape, generator=generator)
    signs = torch.randint(0, 2, candidate.shape, generator=generator) * 2 - 1
    return (candidate.double() + signs * bound * nudge).float()


def _variants(candidate: torch.Tensor, bound: torch.Tensor, generator):
    c = candidate.float()
    yield _at_the_edge(c, bound, generator)
    yield c + 1e-9 * torch.randn(c.shape, generator=generator)
    yield c.clone()
    edge = bound.float()  # the bound rounded to float32: at zeros, a gap either side of it
    for step in (-torch.inf, None, torch.inf):
        gap = edge if step is None else torch.nextafter(edge, torch.full_like(edge, step))
        yield torch.where(c == 0, gap, c)
    near = _at_the_edge(c, bound, generator)
    near[0, -1] = c[0, -1] + 1.0  # off at a padding position only
    yield near
    yield torch.where(torch.rand(c.shape, generator=generator) < 0.1, torch.nan, c)
    yield torch.where(torch.rand(c.shape, generator=generator) < 0.1, torch.inf, c)
    yield c.half()
    yield c.bfloat16()
    yield c.double()


def _candidates(generator):
    shape = (2, 8, 16)
    c = torch.randn(shape, generator=generator)
    yield c
    masked = c.clone()
    masked[:, :, -3:] = -1e30  # masked fillers
    yield masked
    minimum = c.clone()
    minimum[:, -2:] = torch.finfo(torch.float32).min  # the dtype's minimum
    yield minimum
    yield torch.where(c.abs() < 0.5, 0.0, c)  # zeros: with atol 0, a bound of 0
    yield c * 1e-40  # subnormal
    yield c.half()
    yield torch.where(c > 1.5, torch.nan, c)
    yield torch.where(c > 1.5, -torch.inf, c)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("atol,rtol", [(1e-5, 1.3e-6), (0.0, 1e-3), (1e-3, 0.0), (0.0, 0.0)])
def test_verdicts_are_those_of_float64_copies(seed, atol, rtol):
    generator = torch.Generator().manual_seed(seed)
    for candidate in _candidates(generator):
        base = candidate.float() + 0.5  # out of budget everywhere
        for padded in (0, 3):
            quantity = _quantity(candidate.shape, padded)
            for slack, better, base_within in ((8.0, 0.1, None), (16.0, 0.2, False)):
                judge = Judge(base, candidate, quantity, atol, rtol, slack, better, base_within)
                for variant in _variants(candidate, judge.bound, generator):
                    assert judge(variant) == _copies(judge, variant)


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


@pytest.mark.parametrize("fault", ["gelu_tanh", "mask_fill", "ln_eps", "kv_swapped"])
def test_every_hypothesis_of_a_real_fault_is_judged_as_before(tiny, fault):
    reference, batch = tiny
    port = importlib.import_module("tests.ports.hf_like").build(reference, fault, layer=0)
    context = context_for(reference, port, "hf_like", batch, QUANTITY[fault], 0)
    site = locate(context)
    assert site is not None
    base = run_base(site)
    quantity = identify(context.reference_value, base, site.keep, site.heads)
    assert quantity is not None
    judges = [Judge(quantity.layout(base[quantity.name]), context.candidate_value, quantity,
                    context.atol, context.rtol, *loose) for loose in ((), (16.0, 0.2, False))]
    # the masked scores too (the dtype's minimum at padded keys), a fill variant's as the
    # candidate
    scores = Quantity("scores", lambda t: t, identify(base["scores"], base, site.keep,
                                                      site.heads).real)
    fills = [h for h in hypotheses.attention.hypotheses(site) if "adding -10000 " in h.how]
    judges.append(Judge(base["scores"], fills[0].run()["scores"], scores,
                        context.atol, context.rtol))
    found = 0
    for h in (h for family in hypotheses.FAMILIES for h in family.hypotheses(site)):
        values = h.run()
        for judge, name in zip(judges, (quantity.name,) * 2 + ("scores",), strict=True):
            value = quantity.layout(values[name]) if name == quantity.name else values[name]
            verdict = judge(value)
            assert verdict == _copies(judge, value), h.how
            found += verdict is not None
    assert found
