"""A BERT built from ``nn.TransformerEncoderLayer`` (tests/ports/torch_layers.py) through the diff.

torch.fx keeps every torch.nn module whole; the tracer goes into torch's composite layers
(``TransformerEncoderLayer``, ``MultiheadAttention``) so that their projections and norms
pair with HF's. Before, such a port was refused as "a different architecture". Its
attention stays one node (``F.multi_head_attention_forward``), paired with the reference's
attention output.
"""

from __future__ import annotations

import pytest

import introspect
from introspect.diff.records import STATUS_FAIL
from tests.ports import torch_layers
from tests.ports.batch import port_batch

# fault -> (layer, module prefix, how a hint starts)
EXPECTED = {
    "default_eps": ("encoder.layer.0", "encoder.layer.0.attention.output.LayerNorm",
                    "LayerNorm eps differs"),
    "in_proj_kqv": ("encoder.layer.0", "encoder.layer.0.attention",
                    "queries and keys are swapped"),
    "no_padding_mask": ("encoder.layer.0", "encoder.layer.0.attention",
                        "the candidate does not apply the attention mask"),
    "position_offset": ("embeddings", "embeddings", "the candidate's position ids are offset"),
}


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


def test_the_port_passes_on_bert_tiny_and_minilm(tiny, minilm):
    for reference, inputs in (tiny, (minilm.model, port_batch(minilm.tokenizer))):
        result = introspect.diff(reference, torch_layers.build(reference), inputs)
        assert result.passed and not any(r.status == STATUS_FAIL for r in result.rows)
        assert result.alignment.coverage > 0.4
        ops = {r.op_type for r in result.candidate.records}
        assert {"Linear", "LayerNorm", "multi_head_attention_forward"} <= ops  # traced into


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_fault_is_found_in_its_layer_and_named(tiny, fault):
    reference, inputs = tiny
    result = introspect.diff(reference, torch_layers.build(reference, fault, 0), inputs)
    first = result.first_divergence
    layer, module, hint = EXPECTED[fault]
    assert not result.passed and first.layer == layer and first.module.startswith(module)
    assert any(h.startswith(hint) for h in first.hints), first.hints
    if fault != "no_padding_mask":  # the mask is left out of every layer
        assert {r.layer for r in result.rows if r.status == STATUS_FAIL} == {layer}


def test_a_pre_ln_layer_fails_in_its_layer(minilm):
    inputs = port_batch(minilm.tokenizer)
    result = introspect.diff(minilm.model, torch_layers.build(minilm.model, "norm_first", 2),
                             inputs)
    first = result.first_divergence
    assert not result.passed and first.layer == "encoder.layer.2"
    assert first.module.startswith("encoder.layer.2.attention")
