"""A hypothesis's run of the layer reuses the unmodified layer's Linears where it repeats
one (``blocks.Linears``): its values are those of a run computing every Linear, bit for
bit, and a change after the projections (a mask's fill, a tanh GELU) runs fewer."""

from __future__ import annotations

import dataclasses
import importlib

import torch

from introspect.diff.hypotheses.blocks import Linears
from introspect.diff.hypotheses.hypothesis import run_base
from tests.diff.test_hypotheses_stop import _Linears, _runs, _site, tiny  # noqa: F401

hypotheses = importlib.import_module("introspect.diff.hypotheses")


def test_every_hypothesis_reusing_the_base_linears_holds_its_own_runs_values(tiny):  # noqa: F811
    site = _site(tiny)
    own = _runs(site)
    reusing = dataclasses.replace(site, linears=Linears())
    run_base(reusing)
    with _Linears() as seen:
        reused = _runs(reusing)
    with _Linears() as all_of_them:
        _runs(site)
    assert len(seen.weights) < len(all_of_them.weights) / 2
    for i, (a, b) in enumerate(zip(reused, own, strict=True)):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), f"hypothesis {i}: {name}"


def test_a_tanh_gelu_runs_no_linear_of_its_own(tiny):  # noqa: F811
    site = dataclasses.replace(_site(tiny), linears=Linears(), stop="intermediate")
    run_base(site)
    tanh = next(h for h in hypotheses.activation.hypotheses(site) if "tanh" in h.how)
    with _Linears() as seen:
        tanh.run()
    assert seen.weights == []
