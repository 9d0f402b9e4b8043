"""Use ``assert_parity`` in the pytest suite of your own port.

This file is a complete test module: run it with ``pytest examples/test_my_port.py``.
"MyBert" here is the toolkit's own from-scratch BERT; put your port in its place. The
second test shows what a failure looks like: a port whose layer 1 uses tanh GELU.
"""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.scratch import BertForSequenceClassification as MyBert
from introspect.testing import assert_parity


@pytest.fixture(scope="module")
def hf():
    return introspect.load_model("bert-tiny", head="sequence-classification")


@pytest.fixture(scope="module")
def inputs(hf):
    return introspect.tokenize(hf.tokenizer, ["I love cats!", "He hates pineapple pizza."])


def test_port_matches_huggingface(hf, inputs):
    port = MyBert.from_hf(hf.model)
    result = assert_parity(hf.model, port, inputs)
    assert result.max_abs_err == 0.0  # same kernels as HF: bit-exact


def test_a_broken_port_fails_at_the_right_node(hf, inputs):
    port = MyBert.from_hf(hf.model)
    port.bert.encoder.layer[1].intermediate.intermediate_act_fn = torch.nn.GELU("tanh")
    with pytest.raises(AssertionError, match=r"first divergence at .*layer.?1.*intermediate"):
        assert_parity(hf.model, port, inputs)
