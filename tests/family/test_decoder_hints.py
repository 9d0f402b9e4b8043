"""Decoder hints, each tested on the values: a Llama RMSNorm with another eps."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
from tests.fixtures.families import tiny_inputs, tiny_model


@pytest.mark.parametrize(("norm", "eps"), [("post_attention_layernorm", 1e-2),
                                           ("input_layernorm", 1e-3)])
def test_an_rmsnorm_eps_is_found_and_named(norm, eps):
    reference = tiny_model("llama")
    candidate = copy.deepcopy(reference)
    getattr(candidate.layers[1], norm).variance_epsilon = eps
    first = introspect.diff(reference, candidate, tiny_inputs("llama")).first_divergence
    assert (first.layer, first.module) == ("layers.1", f"layers.1.{norm}")
    assert any(h.startswith(f"the candidate's RMSNorm (layers.1.{norm}) uses eps {eps:g}, not "
                            f"the reference's 1e-06") for h in first.hints), first.hints


def test_another_rmsnorm_fault_gets_no_eps_hint():
    reference = tiny_model("llama")
    candidate = copy.deepcopy(reference)
    with torch.no_grad():
        candidate.layers[1].post_attention_layernorm.weight[0] += 0.5
    first = introspect.diff(reference, candidate, tiny_inputs("llama")).first_divergence
    assert first.module == "layers.1.post_attention_layernorm"
    assert not any("eps" in h for h in first.hints), first.hints
