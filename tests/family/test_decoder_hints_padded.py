"""Decoder hints judged on real tokens: with no padding (HF passes ``attention_mask=None``
to its attention and lets sdpa apply the causal mask), with no mask in the inputs at all,
and on a padded batch run by a port that ignores the padding (nanoGPT's attention is
causal only: its padded positions hold other values, which reach no real token)."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
from tests.fixtures.families import faulty_llama_attention, tiny_inputs, tiny_model
from tests.ports import gpt2_linear

LAYER = 1


class PaddingIgnored(torch.nn.Module):
    """A port that ignores the padding: every position is attended, as in nanoGPT."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.inner(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))


def _batches() -> dict[str, tuple[dict[str, torch.Tensor], bool]]:
    """name -> (inputs, whether the port ignores the padding)."""
    padded = tiny_inputs("llama")
    assert not bool(padded["attention_mask"].all())  # the tutorial's pair is padded
    unpadded = {k: v[:, :6] for k, v in padded.items()}
    assert bool(unpadded["attention_mask"].all())
    return {"unpadded": (unpadded, False),
            "no-mask-input": ({"input_ids": unpadded["input_ids"]}, True),
            "padded, port ignores padding": (padded, True)}


BATCHES = _batches()


def _first(reference, candidate, batch: str):
    inputs, wrap = BATCHES[batch]
    result = introspect.diff(reference, PaddingIgnored(candidate) if wrap else candidate,
                             inputs)
    assert not result.passed
    return result.first_divergence


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize(("fault", "node", "hint"), [
    ("rotary-wrong-half", "cat", "the candidate applies rotary embeddings to the wrong half"),
    ("gqa-tiled", "repeat", "the candidate repeats key/value heads in the wrong order"),
    ("no-causal-mask", "scaled_dot_product_attention",
     "the candidate's attention has no causal mask"),
])
def test_a_llama_attention_fault_is_named_whatever_the_padding(monkeypatch, batch, fault,
                                                               node, hint):
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")  # the fault is in an instance's forward
    reference = tiny_model("llama")
    first = _first(reference, faulty_llama_attention(reference, LAYER, fault), batch)
    assert (first.layer, first.module) == ("layers.1", "layers.1.self_attn")
    # Recorded as it runs, HF hands key/value repeats (enable_gqa) and, where the port
    # ignores the padding, the whole attention to sdpa: sdpa is then where its values
    # first differ. The hint must name the fault either way.
    assert first.op in (node, "scaled_dot_product_attention"), first
    named = [h for h in first.hints if h.startswith("the candidate")]
    assert named and all(h.startswith(hint) for h in first.hints), first.hints


GPT2 = {
    "c_proj_untransposed": ("h.1.attn.c_proj",
                            "the candidate's h.1.attn.c_proj multiplies by its weight transposed"),
    "qk_swapped": ("h.1.attn", "the candidate splits its fused projection's output with the "
                               "query and key swapped"),
    "no_causal_mask": ("h.1.attn", "the candidate's attention has no causal mask"),
    "unscaled": ("h.1.attn", "the candidate's attention scores are not scaled"),
}


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("fault", sorted(GPT2))
def test_a_gpt2_fault_is_named_whatever_the_padding(batch, fault):
    reference = tiny_model("gpt2")
    first = _first(reference, gpt2_linear.build(reference, fault, LAYER), batch)
    module, hint = GPT2[fault]
    assert (first.layer, first.module) == ("h.1", module)
    assert first.hints and all(h.startswith(hint) for h in first.hints), first.hints
    no_padding_mask = "nor a padding mask" in first.hints[0]
    # the port that ignores the padding, with no causal mask, has no mask at all; said so
    # only where padding shows it
    assert no_padding_mask == (fault == "no_causal_mask"
                               and batch == "padded, port ignores padding"), first.hints


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_fused_weight_blocks_swapped_are_named_whatever_the_padding(batch):
    reference = tiny_model("gpt2")
    candidate = copy.deepcopy(reference)
    attention = candidate.h[LAYER].attn.c_attn
    with torch.no_grad():  # key and value blocks of the fused (H, 3H) weight swapped
        for tensor, dim in ((attention.weight, 1), (attention.bias, 0)):
            q, k, v = tensor.chunk(3, dim=dim)
            tensor.copy_(torch.cat([q, v, k], dim=dim))
    first = _first(reference, candidate, batch)
    assert (first.layer, first.module) == ("h.1", "h.1.attn.c_attn")
    assert first.hints and first.hints[0].startswith(
        "the candidate's fused query/key/value projection (h.1.attn.c_attn) holds the key "
        "and value blocks swapped"), first.hints


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_the_ports_without_a_fault_pass_whatever_the_padding(monkeypatch, batch):
    monkeypatch.setenv("INTROSPECT_NO_CACHE", "1")
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    inputs, wrap = BATCHES[batch]
    for reference, port in ((llama, faulty_llama_attention(llama, LAYER, "none")),
                            (gpt2, gpt2_linear.build(gpt2))):
        result = introspect.diff(reference, PaddingIgnored(port) if wrap else port, inputs)
        assert result.passed, result.first_divergence
