"""A layer the candidate never runs is named, not the layer after it (probe round g: a
loop from 1 named ``encoder.layer.1``, and GPT-2's ``h.1``). The node that first fails is
the next layer's, handed what the one before the skipped layer returns; no op of the
skipped layer is found in the candidate. Port: ``ports/skipped_layer.py``."""

from __future__ import annotations

import pytest

import introspect
from tests.adversarial.corpus import port


@pytest.mark.parametrize("builder, fixture, skipped", [
    ("faulty_first", "tiny", "encoder.layer.0"),
    ("faulty_middle", "mini", "encoder.layer.3"),
])
def test_a_skipped_layer_is_named(builder, fixture, skipped, request):
    reference, inputs = request.getfixturevalue(fixture)
    result = introspect.diff(reference.model, getattr(port("skipped_layer.py"), builder)(
        reference), inputs)
    assert not result.passed
    assert result.first_divergence.layer == skipped
    assert result.first_divergence.module == skipped
    assert any(h.endswith(f"{skipped} skipped") for h in result.first_divergence.hints)


def test_the_port_running_every_layer_passes(tiny):
    reference, inputs = tiny
    assert introspect.diff(reference.model, port("skipped_layer.py").correct(reference),
                           inputs).passed
