"""A port with no submodules whose attention runs in a thread per layer
(``ports/thread_attention.py``). The recording sees only the caller's thread: fewer than
half the reference's weighted nodes paired, and all pairs were thrown away as "another
model or size". Where the weights the recording did see are the reference's, the pairs
stand (``ops.align._check_same_model``): a fault on the caller's thread is found at its
node. What each thread hands back is a value of the model (``ops.outside``): the ops
before it, which fed only the thread, are kept and compared, and a note says what the
recording could not see.
"""

from __future__ import annotations

from tests.adversarial.corpus import port


def test_the_threaded_port_passes_with_what_the_recording_saw(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("thread_attention.py").correct(reference),
                             inputs)
    assert result.passed, result.summary()
    assert len(result.nodes[result.nodes["candidate_node"] != ""]) > 25
    assert any("handed 2 value(s) computed where it does not reach" in note
               for note in result.notes), result.notes


def test_an_eps_on_the_callers_thread_fails_at_its_layernorm(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("thread_attention.py").faulty(reference),
                             inputs)
    assert not result.passed, result.summary()
    assert (result.outputs["status"] == "ok").all()  # under the outputs' budget
    divergence = result.first_divergence
    assert divergence.reference_node == "encoder_layer_1_output_layer_norm", divergence


def test_other_weights_are_still_refused_their_pairs(tiny):
    """The same port holding other weights (each moved by 1e-3): the weights its recording
    saw are not the reference's, so nothing is paired, and the note says why."""
    import torch

    import introspect

    reference, inputs = tiny
    candidate = port("thread_attention.py").correct(reference)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in candidate.parameters():
            weight += 1e-3 * torch.randn(weight.shape, generator=generator)
    result = introspect.diff(reference.model, candidate, inputs)
    assert not result.passed
    assert result.nodes.empty or (result.nodes["candidate_node"] == "").all()
    assert any("another model or size" in note for note in result.notes), result.notes


def test_a_forward_all_in_a_worker_thread_is_not_called_another_model(tiny):
    """The recording saw none of the port's weights (all read in the thread): not "another
    model or size, or not loaded from the reference?" (probe round o)."""
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model,
                             port("thread_attention.py").correct_all_in_thread(reference),
                             inputs)
    assert result.passed, result.summary()
    said = [n for n in result.notes if n.startswith("no node-level explanation")]
    assert said and "saw none of its weights" in said[0], result.notes
    assert not any("another model" in n for n in result.notes), result.notes
