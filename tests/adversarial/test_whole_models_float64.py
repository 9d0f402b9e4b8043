"""A port with no module of its own to judge (``ports/functional_slip.py``, BERT as
functions over a dict of weights; probe round h's plain-function BERT): a slip under the
outputs' budget PASSED on the outputs alone. Where some of the candidate's computation is
in no judged module, both whole models are run again in float64 after a PASS
(``flow.whole_models``): the slip fails there, and its correct twin agrees to 1e-15."""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.adversarial.corpus import port

precise = importlib.import_module("introspect.diff.modules.precise")
whole = importlib.import_module("introspect.diff.flow.whole_models")
flow_evidence = importlib.import_module("introspect.diff.flow.module_evidence")


@pytest.fixture(scope="module")
def ports():
    return port("functional_slip.py")


def test_the_slip_passes_the_outputs_budget(mini, ports, monkeypatch):
    reference, inputs = mini
    monkeypatch.setattr(whole, "computed_outside_modules", lambda evidence: False)
    monkeypatch.setattr(flow_evidence, "computed_by_glue", lambda *calls: [])
    result = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=False)
    assert result.passed


def test_a_slip_no_module_holds_fails_in_float64(mini, ports):
    reference, inputs = mini
    result = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=False)
    assert not result.passed
    row = result.modules.query("candidate_module == ''").iloc[0]
    assert row.status == "fail" and row.note.startswith("run again in float64")
    assert row.max_abs_err > 2 * row.limit
    assert "in float64" in result.first_divergence.budget
    assert (result.outputs["status"] == "ok").all()
    # named where the two float64 runs part (``modules.departure``), not "outputs"
    assert result.first_divergence.layer == "encoder.layer.3"
    assert row.reference_module == "encoder.layer.3"
    assert "agree with the reference's layers before encoder.layer.3" in row.note


def test_the_correct_twin_agrees_in_float64(mini, ports, monkeypatch):
    reference, inputs = mini
    seen = []

    def kept(*args, **kwargs):
        found = precise.whole_models_in_float64(*args, **kwargs)
        seen.append(found)
        return found

    monkeypatch.setattr(whole, "whole_models_in_float64", kept)
    result = introspect.diff(reference.model, ports.correct(reference), inputs, nodes=False)
    assert result.passed, result.first_divergence
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].check.error < 1e-12


def test_a_slip_beside_one_unjudged_module_is_named_where_the_runs_part(mini):
    """``ports/stacked_layers.py``: the one module owning every weight no judged module
    holds is the position table; the slip is in a layer's LayerNorm. The whole models'
    row names the layer where the float64 runs part, not that table."""
    stacked = port("stacked_layers.py")
    reference, inputs = mini
    assert introspect.diff(reference.model, stacked.correct(reference), inputs,
                           nodes=False).passed
    result = introspect.diff(reference.model, stacked.faulty(reference), inputs, nodes=False)
    layer = f"encoder.layer.{stacked.slip_layer(reference.model)}"
    assert not result.passed and result.first_divergence.layer == layer, \
        result.first_divergence
    rows = result.modules.query("candidate_module == '' and status == 'fail'")
    assert list(rows.reference_module) == [layer], rows


def test_the_heads_of_a_port_with_no_module_per_layer_say_why_they_are_not_local(mini):
    """``ports/stacked_loop.py``'s heads, each model on its own run: the note said its
    attention "takes its input in another layout", untrue of a port laid out as the
    reference is whose attention sits in no module of its own (probe round s)."""
    from introspect.attention import compare_heads

    stacked = port("stacked_loop.py")
    reference, inputs = mini
    parity = compare_heads(reference.model, stacked.correct(reference), inputs)
    assert not parity.local and "sits in no module of its own" in parity.note, parity.note
    assert "another layout" not in parity.summary()
