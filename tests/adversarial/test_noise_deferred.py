"""A module over its floor runs again for its noise only once every module inside it is
judged, and not where one of them fails: the fault is blamed there, and the outer
module's noise run (the encoder's is a whole forward) would only judge what holds it.
Port: ``ports/fused_encoder.py`` (imports only torch); reference: bert-tiny, perturbed."""

from __future__ import annotations

import importlib

import pytest

from tests.adversarial.corpus import port

evidence = importlib.import_module("introspect.diff.modules.evidence")


@pytest.fixture
def noise_runs(monkeypatch):
    """The candidate modules run again for their noise, by path."""
    runs: list[str] = []
    with_noise = evidence.with_noise

    def counted(pair, *args, **kwargs):
        runs.append(pair.call.name)
        return with_noise(pair, *args, **kwargs)

    monkeypatch.setattr(evidence, "with_noise", counted)
    return runs


def _modules(tiny, name):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, getattr(port("fused_encoder.py"), name)(reference),
                             inputs, nodes=False)
    return result, result.modules.set_index("candidate_module")


def test_what_holds_a_failing_module_is_not_run_for_its_noise(tiny, noise_runs):
    result, modules = _modules(tiny, "faulty_tanh")
    assert not result.passed
    assert modules.loc["layers.1.gelu", "status"] == "fail"
    assert result.first_divergence.candidate_module == "layers.1.gelu"
    held = modules.loc["layers.1"]
    assert held["status"] == "not compared" and "inside it is over its budget" in held["note"]
    assert held["max_abs_err"] > 0  # its error is measured; only its budget is not
    assert "layers.1.gelu" in noise_runs and "layers.1" not in noise_runs


def test_a_correct_port_runs_each_module_for_its_noise_as_before(tiny, noise_runs):
    result, modules = _modules(tiny, "correct")
    assert result.passed
    assert not modules["note"].str.contains("inside it is over its budget").any()
