"""A port holding its attention's weights per head for ``einsum`` (``ports/einsum_heads.py``):
(heads, head size, hidden) where HF holds (H, H), the output projection transposed too.

Wrong before: its backward FAILED the correct port (each gradient compared as the port
holds it, not laid out as HF's weight: max abs error 2.5), and where the recording could
not follow it, module evidence found no reference weight its reshaped weights hold, and
the run was refused. A weight's gradient is now laid out as the reference weight it holds
(reshaped, or reshaped and transposed), in both the recorded and the plain backward.
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


@pytest.mark.parametrize("nodes", [False, True])
def test_the_per_head_port_passes_forward_and_backward(tiny, nodes):
    import introspect

    reference, inputs = tiny
    candidate = port("einsum_heads.py").correct(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True, nodes=nodes)
    assert result.passed and result.backward.passed, result.summary()
    if nodes:
        relations = set(result.backward.parameters["relation"])
        assert {"reshaped", "transposed reshaped"} <= relations, relations


@pytest.mark.parametrize("nodes", [False, True])
def test_its_faults_fail_in_layer_1(tiny, nodes):
    import introspect

    reference, inputs = tiny
    ports = port("einsum_heads.py")
    forward = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=nodes)
    assert not forward.passed
    assert forward.first_divergence.layer == "encoder.layer.1", forward.first_divergence
    cut = introspect.diff(reference.model, ports.faulty_gradient(reference), inputs,
                          backward=True, nodes=nodes)
    assert (cut.outputs["status"] == "ok").all()
    assert not cut.passed and not cut.backward.passed
    assert cut.backward.first_divergence.layer == "encoder.layer.1", \
        cut.backward.first_divergence
