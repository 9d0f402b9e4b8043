"""BERT-base: parity with the from-scratch port, and a fault deep in the stack (slow)."""

from __future__ import annotations

import pytest

import introspect
import introspect.scratch as scratch
from introspect.models.load import load_model, tokenize
from tests.fixtures.candidates import inject

pytestmark = [pytest.mark.slow,
              pytest.mark.xdist_group("diff_bert_base")]  # one worker builds BERT-base once


@pytest.fixture(scope="module")
def base():
    loaded = load_model("bert-base")
    return loaded.model, scratch.BertModel.from_hf(loaded.model), tokenize(loaded.tokenizer)


def test_bert_base_agrees_bit_for_bit(base):
    hf, port, inputs = base
    result = introspect.diff(hf, port, inputs)
    assert result.passed and result.max_abs_err == 0.0
    assert len(result.layers) == 16  # inputs, embeddings, mask, 12 layers, pooler


def test_bert_base_fault_in_layer_7_is_found_there(base):
    hf, port, inputs = base
    faulty, node = inject(port, "layer-norm-eps", layer=7)
    d = introspect.diff(hf, faulty, inputs).first_divergence
    assert (d.reference_node, d.layer) == (node, "encoder.layer.7")
