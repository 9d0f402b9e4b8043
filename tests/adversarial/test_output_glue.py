"""A hook on the model itself shifting its output by 1e-5 (``ports/output_hook.py``,
probe round g's ``fault_hook_top_1e5``): every module of the model agrees, and the outputs
moved by less than their budget, so it PASSED. What the model returns from code no module
evidence judged (``accounted.returned_by_glue``) is now judged by both whole models run
again in float64 (``flow.whole_models``), as code in no module is."""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.adversarial.corpus import port

whole = importlib.import_module("introspect.diff.flow.whole_models")


@pytest.fixture(scope="module")
def ports():
    return port("output_hook.py")


@pytest.mark.parametrize("nodes", [False, True])
def test_a_hook_shifting_the_output_fails_at_the_outputs(mini, ports, nodes):
    reference, inputs = mini
    result = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=nodes)
    assert not result.passed
    assert (result.outputs["status"] == "ok").all()  # (under the outputs' budget)
    row = result.modules.query("candidate_module == ''").iloc[0]
    assert row.status == "fail" and row.note.startswith("run again in float64")
    assert "the model returns last_hidden_state from code no module evidence judged" in row.note
    assert result.first_divergence.layer == "outputs"


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("twin", ["copied", "there_and_back"])
def test_a_hook_handing_back_the_same_values_passes(mini, ports, twin, nodes, monkeypatch):
    reference, inputs = mini
    runs = []
    judged = whole.whole_models_in_float64
    monkeypatch.setattr(whole, "whole_models_in_float64",
                        lambda *a, **k: runs.append(1) or judged(*a, **k))
    candidate = getattr(ports, twin)(reference)
    result = introspect.diff(reference.model, candidate, inputs, nodes=nodes)
    assert result.passed, result.summary()
    # a copy is the values a judged module returned; "* 3 / 3" rounds: judged in float64
    assert len(runs) == (twin == "there_and_back")
