"""A Llama block whose attention residual is detached (``ports/llama_detached_residual.py``):
the recorded backward named a node outside it (the add before it, here; the final norm in
another Llama port). The user's own backward shows where the gradients handed to the
modules' outputs part: that block (``flow.gradients._name_where_parted``)."""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.adversarial.corpus import port
from tests.fixtures.families import grouped_llama, tiny_inputs

gradients = importlib.import_module("introspect.diff.flow.gradients")


@pytest.fixture(scope="module")
def llama():
    return grouped_llama(), tiny_inputs("llama")


@pytest.fixture(scope="module")
def ports():
    return port("llama_detached_residual.py")


def test_the_port_passes_its_backward(llama, ports):
    reference, inputs = llama
    result = introspect.diff(reference, ports.correct(reference), inputs, backward=True)
    assert result.passed, result.summary()


def test_a_detached_residual_is_named_in_its_block(llama, ports):
    reference, inputs = llama
    result = introspect.diff(reference, ports.faulty(reference), inputs, backward=True)
    assert (result.outputs["status"] == "ok").all()  # the forward is the same
    d = result.backward.first_divergence
    assert not result.passed and d.layer == f"layers.{ports.DETACHED}", d
    assert any("hands back to" in h for h in d.hints)
    assert any("is not where the gradients" in n for n in result.backward.notes)


def test_the_recorded_backward_alone_names_a_node_after_it(llama, ports, monkeypatch):
    monkeypatch.setattr(gradients, "_name_where_parted", lambda state, parted: None)
    reference, inputs = llama
    result = introspect.diff(reference, ports.faulty(reference), inputs, backward=True)
    d = result.backward.first_divergence
    assert not result.passed and d.layer != f"layers.{ports.DETACHED}", d
