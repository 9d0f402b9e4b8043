"""An index slip in a port's key mapping (``ports/index_slip.py``, written plainly in
another hand): a projection of layer N holding layer N-1's weights. The FAIL names the
layer the projection sits in, with the hint that says which weights it holds, for the
first ops of a block too (its query and value take what the block before returns); the
correct port of the same hand passes."""

from __future__ import annotations

import pytest

import introspect
from tests.adversarial.corpus import port


@pytest.fixture(scope="module")
def ports():
    return port("index_slip.py")


def test_the_correct_port_passes(mini, ports):
    reference, inputs = mini
    assert introspect.diff(reference.model, ports.correct(reference.model), inputs,
                           nodes=False).passed


@pytest.mark.parametrize("slip, layer, module", [
    ("value_from_previous", 3, "attention.self.value"),
    ("query_from_previous", 3, "attention.self.query"),
    ("up_from_previous", 1, "intermediate.dense"),
])
def test_a_projection_from_the_layer_before_is_named_where_it_sits(mini, ports, slip, layer,
                                                                   module):
    reference, inputs = mini
    result = introspect.diff(reference.model, getattr(ports, slip)(reference.model), inputs,
                             nodes=False)
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module) == (f"encoder.layer.{layer}",
                                           f"encoder.layer.{layer}.{module}"), first
    assert any(f"a weight loaded from encoder.layer.{layer - 1} into encoder.layer.{layer}"
               in hint for hint in first.hints), first.hints
