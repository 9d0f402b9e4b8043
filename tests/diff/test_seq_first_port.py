"""A sequence-first BERT port (tests/ports/seq_first.py) through ``introspect.diff``.

The port runs on (S, B, H), folds heads into the batch and attends with ``baddbmm`` and
``bmm``, sums the embeddings in another order and normalises by hand: nothing in it
mirrors HF's graph. It must pass, and each fault must fail in its layer and module.
"""

from __future__ import annotations

import pytest

import introspect
from introspect.diff.records import STATUS_FAIL
from tests.ports import seq_first
from tests.ports.batch import port_batch

# fault -> (layer, module, op, how the hint starts; "" where no hypothesis covers the bug)
EXPECTED = {
    "heads_mixed": ("encoder.layer.0", "encoder.layer.0.attention.self",
                    "scaled_dot_product_attention", ""),
    "mask_wrong_batch": ("encoder.layer.0", "encoder.layer.0.attention.self",
                         "scaled_dot_product_attention",
                         "the candidate masks each head with another row's padding"),
    "ln_eps": ("encoder.layer.0", "encoder.layer.0.attention.output.LayerNorm", "LayerNorm", ""),
    "gelu_tanh": ("encoder.layer.0", "encoder.layer.0.intermediate.intermediate_act_fn",
                  "GELUActivation", "the candidate uses the tanh approximation of GELU"),
    "position_offset": ("embeddings", "embeddings", "add",
                        "the candidate's position ids are offset by +1"),
}


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


def test_the_port_passes_on_bert_tiny(tiny):
    reference, inputs = tiny
    result = introspect.diff(reference, seq_first.build(reference), inputs)
    assert result.passed and not any(r.status == STATUS_FAIL for r in result.rows)


def test_the_port_passes_on_minilm_and_its_eps_fault_is_named(minilm):
    inputs = port_batch(minilm.tokenizer)
    assert introspect.diff(minilm.model, seq_first.build(minilm.model), inputs).passed
    first = introspect.diff(minilm.model, seq_first.build(minilm.model, "ln_eps", 2),
                            inputs).first_divergence
    assert (first.layer, first.module) == ("encoder.layer.2",
                                           "encoder.layer.2.attention.output.LayerNorm")
    assert any(h.startswith("LayerNorm eps differs") and "candidate 1e-05" in h
               for h in first.hints), first.hints


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_fault_fails_in_its_layer_and_module(tiny, fault):
    reference, inputs = tiny
    result = introspect.diff(reference, seq_first.build(reference, fault, 0), inputs)
    first = result.first_divergence
    layer, module, op, hint = EXPECTED[fault]
    assert not result.passed and (first.layer, first.module, first.op) == (layer, module, op)
    failing = {r.layer for r in result.rows if r.status == STATUS_FAIL}
    assert failing <= {layer}, failing  # the error stays local to the faulty layer
    if hint:
        assert first.hints and first.hints[0].startswith(hint), first.hints
    else:  # no hypothesis covers it: no hint may name another cause
        assert not any(h.startswith("the candidate") for h in first.hints), first.hints
