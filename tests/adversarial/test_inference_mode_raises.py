"""A port that cannot run under ``torch.inference_mode()`` (a layer in a worker thread:
grad modes are per thread) gets its verdict from the calls it ran, and a note naming the
worker's error; it was refused before ("could not run on the inputs: KeyError: 'y'")."""

from __future__ import annotations

import pytest

from introspect.cli.main import main
from tests.adversarial.corpus import PORTS, port

RAISED = "raised under torch.inference_mode()"


@pytest.mark.parametrize("nodes", [False, True])
def test_the_correct_port_passes_with_the_workers_error_named(tiny, nodes):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("thread_inference.py").correct(reference),
                             inputs, nodes=nodes)
    said = " ".join(result.notes)
    assert result.passed, said
    assert RAISED in said and "in a worker thread: RuntimeError: Inference tensors" in said
    assert set(result.outputs["call"]) == {"autograd", "no_grad"}  # none made it there


def test_its_faulty_twin_fails_in_the_reference_layer(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("thread_inference.py").faulty(reference),
                             inputs, nodes=False)
    assert not result.passed
    assert result.first_divergence is not None
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence


def test_the_cli_prints_no_traceback_of_the_workers(tiny_folder, capsys):
    code = main(["diff", "--model", str(tiny_folder), "--candidate",
                 f"{PORTS / 'thread_inference.py'}:correct"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "Traceback" not in out + err
    assert RAISED in " ".join(out.split())
