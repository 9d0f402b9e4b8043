"""A projection whose backward is wrong, beside a layer run in a worker thread
(``ports/thread_backward.py``): only each side's own backward judges the gradients, and
its FAIL named the weight nearest the loss whose gradient moved: the previous layer's
(the embeddings before layer 0). What each module's output was handed names the layer
whose backward parts (``backward.parting``)."""

from __future__ import annotations

import importlib

import pytest

from tests.adversarial.corpus import port

plain_parity = importlib.import_module("introspect.diff.backward.plain_parity")


@pytest.fixture(scope="module")
def ports():
    return port("thread_backward.py")


def test_the_threaded_port_passes_its_backward(tiny, ports):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, ports.correct(reference), inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()


@pytest.mark.parametrize("builder, offset", [("faulty_before", -1), ("faulty_inside", 0)])
def test_a_wrong_backward_is_named_in_its_layer(tiny, ports, builder, offset):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, getattr(ports, builder)(reference), inputs,
                             backward=True)
    assert (result.outputs["status"] == "ok").all()  # the forward is exact
    assert not result.passed and not result.backward.passed, result.summary()
    d = result.backward.first_divergence
    layer = f"encoder.layer.{ports.threaded_layer(reference.model) + offset}"
    assert d.layer == layer and d.module == layer, d
    assert any("its backward parts from the reference's" in h for h in d.hints), d.hints
    assert result.first_divergence.layer == layer


def test_without_the_handed_gradients_a_weight_upstream_is_named(tiny, ports, monkeypatch):
    """The naming before: the failing weight nearest the loss, the previous layer's."""
    import introspect

    monkeypatch.setattr(plain_parity, "_parted", lambda *args: None)
    reference, inputs = tiny
    result = introspect.diff(reference.model, ports.faulty_inside(reference), inputs,
                             backward=True)
    d = result.backward.first_divergence
    threaded = ports.threaded_layer(reference.model)
    assert d.parameter and d.layer == f"encoder.layer.{threaded - 1}", d


def test_only_a_failing_output_names_over_the_recorded_path():
    """The weaker naming (no module output's gradient over budget: what took an
    embedding's output) must not read as one at a failing output, which
    ``flow.gradients._name_where_parted`` puts over the recorded node."""
    from introspect.diff.backward.parting import handed_hint, parted_at_an_output, weight_hint
    from introspect.diff.backward.results import BackwardDivergence

    def named(hint):
        return BackwardDivergence("layers.0", "layers.0", "layers.0", "layers.0", "Layer",
                                  1.0, "budget", (hint,))

    assert parted_at_an_output(named(handed_hint("layers.0", "embed")))
    assert not parted_at_an_output(named(weight_hint("embed.weight", "layers.0", "embed")))
