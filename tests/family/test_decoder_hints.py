"""Decoder hints, each tested on the values: RMSNorm eps, rotary half, GQA order, causal mask."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
from tests.fixtures.families import faulty_llama_attention, tiny_inputs, tiny_model


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


@pytest.mark.parametrize(("fault", "node", "hint"), [
    ("rotary-wrong-half", "cat", "the candidate applies rotary embeddings to the wrong half"),
    ("gqa-tiled", "repeat", "the candidate repeats key/value heads in the wrong order"),
    ("no-causal-mask", "scaled_dot_product_attention",
     "the candidate's attention has no causal mask"),
])
def test_a_decoder_attention_fault_is_found_and_named(monkeypatch, fault, node, hint):
    # the port differs from HF only in an instance's forward, which the trace cache's key
    # (class and config) does not see: trace both afresh
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")
    reference = tiny_model("llama")
    candidate = faulty_llama_attention(reference, 1, fault)
    first = introspect.diff(reference, candidate, tiny_inputs("llama")).first_divergence
    assert (first.layer, first.module, first.op) == ("layers.1", "layers.1.self_attn", node)
    assert [h for h in first.hints if h.startswith("the candidate")] and all(
        h.startswith(hint) for h in first.hints), first.hints


def test_the_port_without_a_fault_passes_and_a_weight_fault_gets_no_attention_hint(monkeypatch):
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")
    reference = tiny_model("llama")
    assert introspect.diff(reference, faulty_llama_attention(reference, 1, "none"),
                           tiny_inputs("llama")).passed
    candidate = faulty_llama_attention(reference, 1, "none")
    with torch.no_grad():
        candidate.layers[1].self_attn.q_proj.weight[0, 0] += 0.5
    first = introspect.diff(reference, candidate, tiny_inputs("llama")).first_divergence
    assert first.layer == "layers.1"
    assert not any(word in h for h in first.hints for word in ("rotary", "causal", "key/value"))
