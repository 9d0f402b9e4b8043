"""A PASS proven without running the reference after the candidate calls the reference a
third time only where what it computes with moved (issue 41, part 6: ``run.footprint``).
Ports: ``ports/leaves_behind.py`` (imports nothing of ours): each computes the reference's
values, then leaves something behind on its last call. Changes that outlive the process's
test (a kernel, a torch function) run in a fresh process each."""

from __future__ import annotations

import os
import sys

import pytest

from introspect.errors import InputError
from tests import launch
from tests.adversarial.corpus import PORTS, port

_MOVED = "changed what the reference computes"


def _counted(model):
    """How many times ``model`` is called (a pre-hook on its root module)."""
    calls = [0]
    handle = model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls, handle


def _diff(tiny, name):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("leaves_behind.py"), name)(reference)
    calls, handle = _counted(reference.model)
    try:
        return introspect.diff(reference.model, candidate, inputs, nodes=False), calls[0]
    finally:
        handle.remove()


def test_a_clean_pass_calls_the_reference_twice(tiny):
    result, calls = _diff(tiny, "correct")
    assert result.passed and not result.op_level, result.notes
    assert calls == 2  # autograd and no_grad: no third call, no recording


def test_a_harmless_change_calls_the_reference_again_and_passes(tiny):
    try:
        result, calls = _diff(tiny, "environment")
    finally:
        os.environ.pop("INTROSPECT_LEFT_BEHIND", None)
    assert result.passed and not result.op_level, result.notes
    assert calls == 3  # the environment moved: the call decides, and finds nothing


def test_weights_edited_behind_the_version_counter_are_caught(tiny):
    with pytest.raises(InputError, match=_MOVED):
        _diff(tiny, "weights")


def test_a_fail_explained_inside_a_module_reads_the_footprint_too(tiny):
    """A FAIL explained inside its failing module (``flow.inside``) checks what was left
    behind as a PASS does: a clean faulty port fails, one that also edits the reference's
    weight on its last call gets no verdict."""
    result, _ = _diff(tiny, "faulty")
    assert not result.passed and result.first_divergence.layer == "encoder.layer.1"
    assert any(n.startswith("op-level evidence only inside") for n in result.notes)
    import torch

    weight = tiny[0].model.encoder.layer[0].output.dense.weight
    kept = weight.detach().clone()
    try:
        with pytest.raises(InputError, match=_MOVED):
            _diff(tiny, "faulty_weights")
    finally:
        with torch.no_grad():
            weight.copy_(kept)


@pytest.mark.parametrize("name", ["kernel", "layer_norm"])
def test_a_process_wide_change_gets_no_verdict(name, tiny_folder):
    done = launch.run(
        [sys.executable, "-m", "introspect", "diff", "--model", str(tiny_folder),
         "--candidate", f"{PORTS / 'leaves_behind.py'}:{name}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.splitlines()[-1]  # the diff's check, or the CLI's fingerprint after it
    assert "no verdict" in line and ("reference computes" in line
                                     or "changed the reference" in line), line


def test_the_footprint_names_what_moved(tiny):
    import torch

    from introspect.run import footprint

    model = tiny[0].model
    before = footprint.take(model)
    assert footprint.moved(before, model) == []
    os.environ["INTROSPECT_LEFT_BEHIND"] = "1"
    try:
        assert footprint.moved(before, model) == ["the environment"]
    finally:
        os.environ.pop("INTROSPECT_LEFT_BEHIND")
    weight = model.encoder.layer[1].output.dense.weight
    kept = float(weight[0, 0])
    weight.detach().numpy()[0, 0] += 0.5  # no version counter sees it
    try:
        assert footprint.moved(before, model) == ["encoder.layer.1.output.dense.weight"]
    finally:
        weight.detach().numpy()[0, 0] = kept
    original = model.encoder.layer[0].intermediate.dense.bias
    model.encoder.layer[0].intermediate.dense.bias = torch.nn.Parameter(original.detach().clone())
    try:
        assert footprint.moved(before, model) == [
            "the reference's weights were replaced or moved"]
    finally:
        model.encoder.layer[0].intermediate.dense.bias = original
    assert footprint.moved(before, model) == []
