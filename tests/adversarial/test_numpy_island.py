"""A port that computes part of its run in float32 where the float64 run cannot reach
(``ports/numpy_island.py``: BERT as functions, every LayerNorm in NumPy float32). The
float64 run used to prove nothing there, so an eps slip in one norm PASSED on the outputs'
budget (probe round h). The island rounds in float32 as the reference's own float32 run
does: its values are taken up as they come, and the budget is over the larger float32
error of the two sides (``modules.precise``)."""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.adversarial.corpus import port

precise = importlib.import_module("introspect.diff.modules.precise")
whole = importlib.import_module("introspect.diff.flow.whole_models")


@pytest.fixture(scope="module")
def ports():
    return port("numpy_island.py")


def _kept(monkeypatch) -> list:
    seen: list = []

    def kept(*args, **kwargs):
        found = precise.whole_models_in_float64(*args, **kwargs)
        seen.append(found)
        return found

    monkeypatch.setattr(whole, "whole_models_in_float64", kept)
    return seen


def test_an_eps_slip_in_a_numpy_norm_fails_in_float64(mini, ports):
    reference, inputs = mini
    result = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=False)
    assert not result.passed
    assert (result.outputs["status"] == "ok").all()  # (under the outputs' budget)
    row = result.modules.query("candidate_module == ''").iloc[0]
    assert row.status == "fail" and row.note.startswith("run again in float64")
    assert "rounds in float32 where float64 does not reach" in row.note
    assert "outside the run" in row.note
    assert row.max_abs_err > 1.2 * row.limit
    # every norm in NumPy, none a module: named where the float64 runs part
    assert result.first_divergence.layer == f"encoder.layer.{ports.slip_layer(reference.model)}"


def test_the_correct_numpy_port_agrees_within_its_islands_rounding(mini, ports,
                                                                  monkeypatch):
    reference, inputs = mini
    seen = _kept(monkeypatch)
    result = introspect.diff(reference.model, ports.correct(reference), inputs, nodes=False)
    assert result.passed, result.first_divergence
    assert len(seen) == 1 and seen[0] is not None
    check = seen[0].check
    assert check.island and check.candidate_error > 0
    # every norm rounds once in float32: a share of the reference's float32 error
    assert check.error < 0.25 * check.limit



def test_a_norm_computed_in_a_method_is_named_in_its_layer(mini):
    """A layer's output LayerNorm in NumPy, in a method of the model
    (``ports/numpy_method.py``): named at the value NumPy hands back (``ops.outside``)."""
    reference, inputs = mini
    ports = port("numpy_method.py")
    result = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=False)
    assert not result.passed
    assert (result.outputs["status"] == "ok").all()
    layer = "encoder.layer.3"
    divergence = result.first_divergence
    assert (divergence.layer, divergence.module) == (layer, f"{layer}.output.LayerNorm"), \
        divergence
    correct = introspect.diff(reference.model, ports.correct(reference), inputs, nodes=False)
    assert correct.passed, correct.first_divergence


def test_the_whole_models_fail_names_the_one_module_no_judged_module_holds():
    """The float64 FAIL of the whole models names a module where every weight no judged
    module holds is that reference module's (a layer's norm the model computes by hand:
    probe round g's port_b), and no module where they are several modules' (a port
    written as functions)."""
    from introspect.diff.modules.evidence import ModuleEvidence

    norm = "encoder.layer.1.output.LayerNorm"
    one = ModuleEvidence(relations={
        "blocks.1.norm2.weight": {f"{norm}.weight"}, "blocks.1.norm2.bias": {f"{norm}.bias"},
        "blocks.1.proj.weight": {"encoder.layer.1.attention.output.dense.weight"}},
        called={"blocks.1.proj"})
    assert whole._unjudged_module(one) == norm
    functions = ModuleEvidence(relations={
        "w.a": {f"{norm}.weight"}, "w.b": {"encoder.layer.0.output.dense.weight"}})
    assert whole._unjudged_module(functions) == ""
