"""``torch.func.functional_call`` on a randomly initialised skeleton, the weights held as
the port's buffers (``ports/functional_call.py``; probe round g's ``p_more``): the
recording read each leaf module's weights from the skeleton once the call returned, so it
shared weights with none of the reference's nodes and was dropped, and a fault was named
at the outputs, in no layer. Each leaf call's weights are noted as it ends, and the graph
holds those (``ops.swapped``)."""

from __future__ import annotations

import pytest

import introspect
from tests.adversarial.corpus import port


@pytest.fixture(scope="module")
def ports():
    return port("functional_call.py")


def test_the_correct_port_passes_with_its_nodes_paired(mini, ports):
    reference, inputs = mini
    result = introspect.diff(reference.model, ports.correct(reference), inputs)
    assert result.passed, result.first_divergence
    paired = result.nodes.query("candidate_node != ''")
    assert len(paired) > 0.6 * len(result.nodes)
    assert (paired["matched_by"] == "weights").sum() >= 40  # (the Linears and norms)


def test_a_weight_from_the_previous_layer_is_named_in_its_layer(mini, ports):
    reference, inputs = mini
    result = introspect.diff(reference.model, ports.faulty(reference), inputs)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.3", divergence
    assert divergence.module == "encoder.layer.3.attention.output.LayerNorm", divergence
    assert any("loaded from encoder.layer.2 into encoder.layer.3" in h
               for h in divergence.hints), divergence.hints
    assert not any("left unloaded" in h for h in divergence.hints), divergence.hints


def test_the_skeleton_holds_its_own_weights_again(mini, ports):
    """The copies the graph is built on are the recording's alone."""
    import torch

    reference, inputs = mini
    candidate = ports.correct(reference)
    before = {n: p.clone() for n, p in candidate.skeleton.named_parameters()}
    introspect.diff(reference.model, candidate, inputs)
    after = dict(candidate.skeleton.named_parameters())
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(type(m).__name__ != "Linear" or isinstance(m.weight, torch.nn.Parameter)
               for m in candidate.skeleton.modules())
