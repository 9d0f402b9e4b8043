"""A weight loaded into the wrong layer (an off-by-one in a port's key mapping): layer 3's
``output.dense`` holding layer 2's values. The op-level pairs a node by the values of the
weights it reads, so the FAIL named ``encoder.layer.2``, whose code and weights are right
(probe round g, 6 runs). Values flow forward: a node reading layer 2's weights on layer 3's
values sits in layer 3, which is named now, with a hint. A weight from the next layer was
named right already (its inputs come from an earlier layer) and stays so."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect


@pytest.fixture(scope="module")
def inputs(minilm):
    return introspect.tokenize(minilm.tokenizer)


def _loaded_from(reference: torch.nn.Module, into: int, source: int) -> torch.nn.Module:
    port = copy.deepcopy(reference).eval()
    with torch.no_grad():
        port.encoder.layer[into].output.dense.weight.copy_(
            reference.encoder.layer[source].output.dense.weight)
    return port


@pytest.mark.parametrize("into, source", [(3, 2), (2, 3)])
def test_the_layer_it_sits_in_is_named(minilm, inputs, into, source):
    result = introspect.diff(minilm.model, _loaded_from(minilm.model, into, source), inputs)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == f"encoder.layer.{into}", divergence
    if source < into:
        assert divergence.module == f"encoder.layer.{into}.output.dense"
        assert any(f"a weight loaded from encoder.layer.{source} into encoder.layer.{into}" in h
                   for h in divergence.hints), divergence.hints
