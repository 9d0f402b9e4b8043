"""A fused ``qkv`` weight where only each side's own backward can judge the gradients
(``ports/fused_thread.py``: the encoder in a worker thread). The fused weight was "no one
reference weight alone", and ``--backward`` refused the port; each block of its rows is
held to the reference weight it equals now (``backward.plain_parity._fused_blocks``).
"""

from __future__ import annotations

from tests.adversarial.corpus import port


def test_the_fused_port_passes_its_backward_on_its_own(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("fused_thread.py").correct(reference),
                             inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()
    relations = set(result.backward.parameters["relation"])
    assert "fused" in relations, relations


def test_a_cut_value_fails_at_its_rows(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("fused_thread.py").faulty(reference),
                             inputs, backward=True)
    assert (result.outputs["status"] == "ok").all()
    assert not result.backward.passed
    divergence = result.backward.first_divergence
    assert divergence.parameter.startswith("encoder.layer.1.attention.self.value."), divergence
