"""Reentrant checkpoints in a worker thread (``ports/checkpoint_thread.py``): only each
side's own backward can judge the gradients, and the layers' outputs, made without
autograd inside the checkpoints, are handed none. They were compared as zeros and the run
refused; now they are not compared, and the weights' gradients decide.
"""

from __future__ import annotations

from tests.adversarial.corpus import port


def test_the_threaded_checkpointed_port_passes_its_backward(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("checkpoint_thread.py").correct(reference),
                             inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()


def test_a_cut_gradient_fails_in_its_layer(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("checkpoint_thread.py").faulty(reference),
                             inputs, backward=True)
    assert (result.outputs["status"] == "ok").all()
    assert not result.passed and not result.backward.passed, result.summary()
    assert result.backward.first_divergence.layer == "encoder.layer.1", \
        result.backward.first_divergence
