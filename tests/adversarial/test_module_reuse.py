"""Module evidence reads a submodule's run on the reference's inputs from its parent's run
(``introspect.diff.modules.reuse``) only where that call took exactly what its own run
would: every row is the one full runs give (``reuse.REUSE`` off), and fewer modules run.
Ports: ``tests/adversarial/ports/module_reuse.py`` (HF's own BertModel, changed: another
hand's code); reference: bert-tiny with perturbed norms and biases."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest

from tests.adversarial.corpus import port

local = importlib.import_module("introspect.diff.modules.local")
reuse = importlib.import_module("introspect.diff.modules.reuse")


@pytest.fixture
def runs(monkeypatch):
    """The exact runs of module evidence (``local._rerun`` on the reference's inputs, not
    the noise run on them rounded), by candidate module."""
    counted: Counter[str] = Counter()
    rerun = local._rerun

    def counting(pair, path, change, **options):
        if change.__name__ != "rounded":
            counted[pair.call.name] += 1
        return rerun(pair, path, change, **options)

    monkeypatch.setattr(local, "_rerun", counting)
    return counted


def _judged(monkeypatch, runs, judge, reusing: bool):
    """``judge()``'s module rows (as tuples) and the modules it ran, with reuse on or off."""
    monkeypatch.setattr(reuse, "REUSE", reusing)
    runs.clear()
    rows, verdict = judge()
    rows = [tuple(None if v != v else v for v in r.values())  # (NaN: not measured)
            for r in rows.to_dict("records")]
    return rows, verdict, Counter(runs)


def _diff(tiny, builder):
    import introspect

    reference, inputs = tiny

    def judge():
        result = introspect.diff(reference.model, builder(reference), inputs, nodes=False)
        return result.modules, (result.passed, result.first_divergence)

    return judge


def test_a_fault_early_runs_fewer_modules_and_gives_the_same_rows(tiny, monkeypatch, runs):
    judge = _diff(tiny, port("module_reuse.py").tanh_first_layer)
    full, verdict, every = _judged(monkeypatch, runs, judge, reusing=False)
    rows, reused_verdict, fewer = _judged(monkeypatch, runs, judge, reusing=True)
    assert rows == full and reused_verdict == verdict
    assert not verdict[0] and verdict[1].layer == "encoder.layer.0"
    # layer 1 is run on the reference's inputs, its submodules inside that run
    assert fewer["encoder.layer.1"] == 1 and every["encoder.layer.1.attention.self.query"] == 1
    assert not fewer["encoder.layer.1.attention.self.query"]
    assert sum(fewer.values()) * 3 < sum(every.values()), (fewer, every)


def test_an_argument_the_parent_computes_from_its_input_is_not_reused(tiny, monkeypatch, runs):
    """The scale layer 1's FFN computes from the reference's input differs from the one the
    activation's own call took: the activation runs on its own, with its own scale."""
    judge = _diff(tiny, port("module_reuse.py").scaled)
    full, verdict, _ = _judged(monkeypatch, runs, judge, reusing=False)
    rows, reused_verdict, ran = _judged(monkeypatch, runs, judge, reusing=True)
    assert rows == full and reused_verdict == verdict
    assert not verdict[0]
    assert ran["encoder.layer.1"] == 1, ran  # its parent ran inside: it could have been read
    assert ran["encoder.layer.1.intermediate.intermediate_act_fn"] == 1
    assert not ran["encoder.layer.1.intermediate.dense"]  # (its input is the reference's)


def test_a_submodule_that_edits_its_input_in_place_is_not_reused(tiny, monkeypatch, runs):
    """Armed after the plain calls, ``Mix(h, h)`` doubles its first argument in place and
    halves it back: in its parent's run both arguments are one tensor (2 h), in its own
    run two copies (1.5 h). Its arguments hold the same values after the call, but their
    version moved: not reused."""
    from introspect.diff.modules import gather_module_evidence
    from introspect.run.capture import capture_calls
    from introspect.run.truth import run_truth

    reference, tokenized = tiny
    inputs = tokenized.tensors
    ports = port("module_reuse.py")
    candidate = ports.aliased(reference)
    with capture_calls(reference.model) as ref_calls:
        run_truth(reference.model, inputs)
    with capture_calls(candidate, share=ref_calls) as cand_calls:
        run_truth(candidate, inputs, grad_calls=2)
    for module in candidate.modules():
        if isinstance(module, ports.Mix):
            module.armed = True

    def judge():
        evidence = gather_module_evidence(ref_calls, cand_calls, inputs["attention_mask"],
                                          keep_calls=True)
        return evidence.frame(), evidence.passed

    full, verdict, _ = _judged(monkeypatch, runs, judge, reusing=False)
    rows, reused_verdict, ran = _judged(monkeypatch, runs, judge, reusing=True)
    assert rows == full and reused_verdict == verdict
    assert ran["encoder.layer.1"] == 1, ran
    assert ran["encoder.layer.1.intermediate.mix"] == 1
    mix = [r for r in rows if r[0] == "encoder.layer.1.intermediate.mix"]
    assert len(mix) == 1 and mix[0][-2] == "fail"  # (1.5 h where h was returned)
