"""LayerNorms in NumPy inside a custom ``autograd.Function``, called inline
(``ports/numpy_function.py``): the recording took each one's output for a constant and
paired nothing after the first; a Function whose outputs come from no recorded op on its
inputs is one opaque node now (``ops.eager``), replayed on the reference's values.
"""

from __future__ import annotations

from tests.adversarial.corpus import port


def test_the_numpy_port_is_paired_and_passes_forward_and_backward(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("numpy_function.py").correct(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()
    paired = result.nodes[result.nodes["candidate_node"] != ""]
    assert (paired["reference_node"] == "encoder_layer_1_output_layer_norm").any()
    assert len(result.backward.nodes) > 20  # node gradients through the NumPy backward


def test_an_eps_in_numpy_fails_at_its_layernorm(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("numpy_function.py").faulty(reference)
    result = introspect.diff(reference.model, candidate, inputs)
    assert not result.passed, result.summary()
    divergence = result.first_divergence
    assert divergence.reference_node == "encoder_layer_1_attention_output_layer_norm", \
        divergence


def test_a_numpy_backward_without_the_gain_fails_there(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("numpy_function.py").faulty_backward(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True)
    assert result.backward is not None and not result.backward.passed
    assert result.backward.first_divergence.layer == "encoder.layer.1", \
        result.backward.first_divergence
