"""A weight loaded into the wrong layer (an off-by-one in a port's key mapping): layer 3's
``output.dense`` holding layer 2's values. The op-level pairs a node by the values of the
weights it reads, so the FAIL named ``encoder.layer.2``, whose code and weights are right
(probe round g, 6 runs). Values flow forward: a node reading layer 2's weights on layer 3's
values sits in layer 3, which is named now, with a hint. A weight from the next layer was
named right already (its inputs come from an earlier layer) and stays so.

The first ops of a block (its query, key and value) take what the block before returns:
their inputs come from that block, yet the reference reads them in this one alone. They
were named in the layer whose weights they hold, with no hint (probe round i); the
value's reader names the layer now (``divergence._fed_by``'s ``handed``)."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect


@pytest.fixture(scope="module")
def inputs(minilm):
    return introspect.tokenize(minilm.tokenizer)


def _loaded_from(reference: torch.nn.Module, into: int, source: int,
                 module: str = "output.dense") -> torch.nn.Module:
    port = copy.deepcopy(reference).eval()
    with torch.no_grad():
        port.encoder.layer[into].get_submodule(module).weight.copy_(
            reference.encoder.layer[source].get_submodule(module).weight)
    return port


@pytest.mark.parametrize("into, source, module", [
    (3, 2, "output.dense"), (2, 3, "output.dense"),
    (3, 2, "attention.self.query"), (3, 2, "attention.self.value"),
    (4, 1, "attention.self.key")])
def test_the_layer_it_sits_in_is_named(minilm, inputs, into, source, module):
    result = introspect.diff(minilm.model, _loaded_from(minilm.model, into, source, module),
                             inputs)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == f"encoder.layer.{into}", divergence
    if source < into:
        assert divergence.module == f"encoder.layer.{into}.{module}"
        assert any(f"a weight loaded from encoder.layer.{source} into encoder.layer.{into}" in h
                   for h in divergence.hints), divergence.hints


def test_an_attention_output_from_the_layer_before_is_named_where_it_sits(minilm, inputs):
    """Its attention's ops around it pair with the layer before by its weights; the block
    holding it is the next layer's in every other weight (``modules.blocks``)."""
    result = introspect.diff(minilm.model,
                             _loaded_from(minilm.model, 3, 2, "attention.output.dense"), inputs)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.3", divergence
    assert "encoder.layer.3.attention.output.dense.weight holds encoder.layer.2.attention." \
        "output.dense.weight's values" in divergence.hints[0], divergence.hints


def test_a_layer_loaded_whole_from_the_layer_before_is_named_where_it_sits(minilm, inputs):
    """Layer 5 holding layer 4's weights, as layer 4 does: its ops pair with layer 4's,
    where the values agree; no block holds layer 5's weights, and its place is layer 5."""
    port = copy.deepcopy(minilm.model).eval()
    port.encoder.layer[5].load_state_dict(minilm.model.encoder.layer[4].state_dict())
    result = introspect.diff(minilm.model, port, inputs)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.5", divergence
    assert divergence.candidate_module.startswith("encoder.layer.5."), divergence
    assert "encoder.layer.4's weights loaded into encoder.layer.5" in divergence.hints[0]


def test_a_transposed_weight_is_named_so(minilm, inputs):
    """A Linear holding the reference's (square) weight transposed: the hint says so. A
    Linear holding GPT-2's Conv1D weight (stored (in, out)) transposed is right, and gets
    no such hint (``tests/adversarial/test_loading_slips.py``: its slips)."""
    port = copy.deepcopy(minilm.model).eval()
    with torch.no_grad():
        weight = port.encoder.layer[2].attention.output.dense.weight
        weight.copy_(weight.t().clone())
    result = introspect.diff(minilm.model, port, inputs, nodes=False)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.module == "encoder.layer.2.attention.output.dense", divergence
    assert any("a Linear expects (out_features, in_features): a transposed weight" in h
               for h in divergence.hints), divergence.hints
