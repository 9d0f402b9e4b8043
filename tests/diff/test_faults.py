"""Parity where the kernels agree, and injected faults found at the node that holds them."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
import introspect.scratch as scratch
from introspect.models.load import HEADS, tokenize
from introspect.testing import assert_parity
from tests.bounds import below
from tests.fixtures.candidates import FAULTS, PerHeadBert, fuse_qkv, inject

HINTS = {
    "intermediate-bias": "intermediate.dense.bias differs",
    "layer-norm-eps": "LayerNorm eps differs: reference 1e-12, candidate 0.001",
    "tanh-gelu": "tanh approximation of GELU",
    "attention-scale": "attention scale differs",
    "transposed-weight": "transposed",
    "unloaded-weight": "left unloaded",
    "mask-value": "the attention mask differs",
}


def test_hf_and_scratch_agree_bit_for_bit(tiny_diff):
    assert tiny_diff.passed and tiny_diff.first_divergence is None
    assert tiny_diff.max_abs_err == 0.0
    assert set(tiny_diff.layers["layer"]) >= {"embeddings", "encoder.layer.0", "encoder.layer.1",
                                                "pooler"}


@pytest.mark.parametrize("head", [h for h in HEADS if h != "base"])
def test_every_head_agrees_bit_for_bit(tiny_models, head):
    loaded = tiny_models(head, "sdpa")
    texts = ("I love cats!", "He hates pineapple pizza.")
    inputs = tokenize(loaded.tokenizer, texts, head=head)
    port = scratch.MODELS[HEADS[head]].from_hf(loaded.model)
    result = introspect.diff(loaded.model, port, inputs)
    assert result.passed and result.max_abs_err == 0.0
    assert "head" in set(result.layers["layer"]) or head in ("base",)


@pytest.mark.parametrize("head", ["base", "sequence-classification"])
def test_eager_attention_agrees_bit_for_bit(tiny_models, head):
    loaded = tiny_models(head, "eager")
    port = scratch.MODELS[HEADS[head]].from_hf(loaded.model)
    result = introspect.diff(loaded.model, port, tokenize(loaded.tokenizer))
    assert result.passed and result.max_abs_err == 0.0


@pytest.mark.numeric
def test_sdpa_against_eager_passes_within_fp32_noise(tiny, inputs):
    eager = scratch.BertModel.from_hf(tiny, attn_implementation="eager")
    result = introspect.diff(tiny, eager, inputs)
    assert result.passed and 0.0 < result.max_abs_err and below(result.max_abs_err, 1e-5)


def test_minilm_agrees_bit_for_bit(minilm):
    port = scratch.BertModel.from_pretrained(minilm.folder)
    result = assert_parity(minilm.model, port, tokenize(minilm.tokenizer))
    assert result.max_abs_err == 0.0 and len(result.layers) == 10


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_is_found_at_its_node(tiny, port, inputs, fault):
    faulty, node = inject(port, fault, layer=1)
    result = introspect.diff(tiny, faulty, inputs)
    assert not result.passed
    d = result.first_divergence
    assert (d.reference_node, d.layer) == (node, "encoder.layer.1")
    assert any(HINTS[fault] in h for h in d.hints), d.hints
    layers = result.layers.set_index("layer")
    assert layers.loc["encoder.layer.0", "passed"] and not layers.loc["encoder.layer.1", "passed"]


def test_fault_in_the_first_layer_is_not_reported_later(tiny, port, inputs):
    faulty, node = inject(port, "tanh-gelu", layer=0)
    d = introspect.diff(tiny, faulty, inputs).first_divergence
    assert d.reference_node == node and d.layer == "encoder.layer.0"


def test_fused_qkv_candidate_passes(tiny, port, inputs):
    result = assert_parity(tiny, fuse_qkv(port), inputs)
    assert result.max_abs_err == 0.0


def test_per_head_candidate_passes(tiny, inputs):
    result = assert_parity(tiny, PerHeadBert.from_hf(tiny), inputs)
    assert below(result.max_abs_err, 1e-5)
    notes = " ".join(result.notes)
    assert "pooler_output" in notes  # the tutorial's model has no pooler, and we say so


def test_lower_precision_fails_by_default_and_passes_on_its_noise(tiny, inputs):
    half = copy.deepcopy(tiny).to(torch.bfloat16)
    strict = introspect.diff(tiny, half, inputs)
    assert not strict.passed
    assert any("bfloat16" in h for h in strict.first_divergence.hints)
    assert introspect.diff(tiny, half, inputs, noise_budget=True).passed


def test_padding_errors_are_reported_apart(tiny, inputs):
    class NoisyPadding(torch.nn.Module):  # changes only the padded positions' output
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids)
            hidden = out["last_hidden_state"]
            noise = (1 - attention_mask)[..., None].to(hidden.dtype)
            return {"last_hidden_state": hidden + noise}

    result = introspect.diff(tiny, NoisyPadding(scratch.BertModel.from_hf(tiny)), inputs)
    assert result.passed
    nodes = result.nodes
    out = nodes[nodes["matched_by"] == "output"].iloc[0]
    assert out["reference_node"] == "encoder_layer_1_output_layer_norm"
    assert out["max_abs_err"] == 0.0 and out["pad_max_abs_err"] == pytest.approx(1.0)


def test_assert_parity_message_names_the_node_and_the_layers(tiny, port, inputs):
    faulty, node = inject(port, "intermediate-bias", layer=1)
    with pytest.raises(AssertionError) as error:
        assert_parity(tiny, faulty, inputs)
    message = str(error.value)
    assert f"first divergence at {node}" in message
    assert "hint:" in message and "encoder.layer.1" in message and "FAIL" in message
