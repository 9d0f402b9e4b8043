"""``--generate`` on Llama ports written Meta's way (``meta_llama.py``, written by a probe
helper: its own names, rotary table and cache). A cache that holds keys before their
rotation, or Meta's interleaved order within a head, matches HF's in no layout: the
prefill's outputs agree while its keys do not, and each such port FAILED at step 0,
named in the cache (probe round m); a fault of layer 1 after the prefill was named
there too. A cached tensor is now held to the reference's only in a layout the prefill
proved; the step that reads it fails where it is wrong."""

from __future__ import annotations

import types

import pytest
import torch

import introspect
from tests.generate import meta_llama

PROMPT = torch.tensor([[1, 15, 27, 8, 42]])


@pytest.fixture(scope="module")
def reference():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=100, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                         hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # (random init leaves every norm at 1)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
    return types.SimpleNamespace(model=model, config=config)


@pytest.mark.parametrize("rope, cache", [("half", "prerot"), ("complex", "tuple"),
                                         ("half_swapped", "tuple")])
def test_a_cache_in_another_layout_passes(reference, rope, cache):
    port = meta_llama.make(reference, rope=rope, cache=cache)
    result = introspect.diff(reference.model, port, {"input_ids": PROMPT}, generate=3)
    assert result.passed, result.summary()
    assert any("match the reference's in no layout tried, from the prefill on" in n
               for n in result.notes), result.notes


@pytest.mark.parametrize("rope", ["complex", "half"])
def test_a_fault_after_the_prefill_is_named_in_its_layer(reference, rope):
    port = meta_llama.make(reference, rope=rope, cache="tuple", norot_at=1)
    result = introspect.diff(reference.model, port, {"input_ids": PROMPT}, generate=3)
    assert not result.passed
    divergence = result.first_divergence
    assert (divergence.step, divergence.layer) == (1, "layers.1"), divergence
