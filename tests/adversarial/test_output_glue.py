"""Code between a model's modules that computes what it hands on (*glue*): a hook on the
model shifting its output by 1e-5 (``ports/output_hook.py``, probe round g's
``fault_hook_top_1e5``), a loop handing the pooler its input scaled by 1 + 3e-6
(``ports/loop_glue.py``). Every module agrees on the reference's inputs and the outputs
move by less than their budget, so both PASSED. What glue computed
(``accounted.computed_by_glue``) is now judged by both whole models run again in float64
(``flow.whole_models``), as code holding weights in no module is."""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.adversarial.corpus import port

whole = importlib.import_module("introspect.diff.flow.whole_models")
flow_evidence = importlib.import_module("introspect.diff.flow.module_evidence")


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


@pytest.mark.parametrize("nodes", [False, True])
def test_a_loop_scaling_what_it_hands_the_pooler_fails_there(mini, nodes, monkeypatch):
    reference, inputs = mini
    with monkeypatch.context() as without:  # (glue not judged: it passed)
        without.setattr(flow_evidence, "computed_by_glue", lambda *calls: [])
        assert introspect.diff(reference.model, port("loop_glue.py").faulty(reference), inputs,
                               nodes=nodes).passed
    result = introspect.diff(reference.model, port("loop_glue.py").faulty(reference), inputs,
                             nodes=nodes)
    assert not result.passed
    assert (result.outputs["status"] == "ok").all()  # (under the outputs' budget)
    assert result.first_divergence.layer == "pooler", result.first_divergence
    row = result.modules.query("candidate_module == ''").iloc[0]
    assert "pooler.dense takes args.0 from code no module evidence judged" in row.note, row.note


def test_the_same_loop_unscaled_passes_in_float64(mini, monkeypatch):
    reference, inputs = mini
    runs = []
    judged = whole.whole_models_in_float64
    monkeypatch.setattr(whole, "whole_models_in_float64",
                        lambda *a, **k: runs.append(1) or judged(*a, **k))
    result = introspect.diff(reference.model, port("loop_glue.py").correct(reference), inputs,
                             nodes=False)
    assert result.passed, result.summary()
    assert runs == [1]  # (its mask is made by its own code: judged in float64)
