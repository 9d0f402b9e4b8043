"""``--backward`` on ports the gradient recorder cannot run (issue 41, parts 4 and 6): code
compiled with ``torch.compile``, a worker thread, ``torch.func.vmap``, a LayerNorm in
NumPy. Each side's own backward of its first plain call decides (``backward.plain_parity``);
with node tables, taken once the recording failed (``flow.gradients.own_gradients_late``):
the correct twin passes, the faulty one fails in the reference's layer, and a NumPy
region, through which no gradient reaches the weights, fails the backward. Ports:
``tests/adversarial/ports/modules_evidence.py`` (imports nothing of ours)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.adversarial.corpus import port

BLIND = ["compiled", "vmap"]


def _diff(tiny, builder, nodes=False):
    import introspect

    reference, inputs = tiny
    torch._dynamo.reset()  # each compiled port compiles afresh (dynamo's recompile limit)
    return introspect.diff(reference.model, builder(reference), inputs, backward=True,
                           nodes=nodes)


@pytest.mark.parametrize("name", BLIND)
def test_a_correct_port_the_recorder_cannot_run_passes_on_its_own_backward(name, tiny):
    result = _diff(tiny, getattr(port("modules_evidence.py"), f"correct_{name}"))
    b = result.backward
    assert result.passed and b.passed, result.summary()
    assert b.rows == [] and len(b.parameter_rows) >= 30
    assert any("each side's own backward decides" in n for n in b.notes)


def test_a_threaded_port_is_recorded_through_what_its_thread_hands_back(tiny):
    """Its FFN in a worker thread: the recording was blind to it (the ops before the
    thread fed nothing it saw) and each side's own backward decided. What the thread
    hands back is a model value now (``ops.outside``): the ops around it are recorded and
    their gradients compared, every weight's too; the own backwards are taken as well."""
    result = _diff(tiny, port("modules_evidence.py").correct_thread)
    b = result.backward
    assert result.passed and b.passed, result.summary()
    assert len(b.rows) >= 30 and len(b.parameter_rows) >= 30
    assert len(result.nodes.query("candidate_node != ''")) > 40


@pytest.mark.parametrize("name", [*BLIND, "thread"])
def test_its_faulty_twin_fails_in_the_reference_layer(name, tiny):
    result = _diff(tiny, getattr(port("modules_evidence.py"), f"faulty_{name}"))
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"
    assert not result.backward.passed  # a tanh GELU or a scale trains otherwise too
    assert result.backward.first_divergence.layer == "encoder.layer.1"


@pytest.mark.parametrize("builder, code", [("correct_compiled", 0), ("faulty_vmap", 1)])
def test_with_a_report_it_gets_the_same_verdict(tiny_folder, tmp_path, capsys, builder, code):
    """``--backward --out`` was exit 2 ("could not record the candidate"): the report is
    written, with the own backwards' verdict, the faulty twin named in its layer."""
    from introspect.cli.main import main

    torch._dynamo.reset()
    got = main(["diff", "--model", str(tiny_folder), "--candidate",
                f"{port('modules_evidence.py').__file__}:{builder}", "--backward",
                "--out", str(tmp_path / "report")])
    out, err = capsys.readouterr()
    assert got == code, out + err
    assert "Traceback" not in out + err and "could not record" not in err
    assert "0 node gradients, 39 parameters" in out, out
    if code:
        assert "first divergence: encoder.layer.1" in out, out
    written = json.loads((tmp_path / "report" / "diff.json").read_text())
    assert written["passed"] is (code == 0)


def test_a_numpy_region_fails_the_backward_where_no_gradient_reaches(tiny):
    """Its forward agrees (module evidence covers the NumPy LayerNorm), but no gradient
    flows through NumPy: the candidate's loss reaches none of its weights."""
    result = _diff(tiny, port("modules_evidence.py").correct_numpy)
    b = result.backward
    assert not result.passed and not b.passed
    assert (result.outputs["status"] == "ok").all()
    assert any("does not depend on its parameters" in n for n in b.notes)
    assert b.first_divergence.layer == "encoder.layer.1"


def test_a_scripted_faulty_port_fails_its_forward_with_gradients_not_compared(tiny):
    """TorchScript blocks: the gradient recorder cannot run them, and each side's own
    backward proves nothing where the losses differ. Its forward fails on its own evidence
    (the outputs, module evidence in encoder.layer.1): that FAIL is the verdict, where the
    diff raised (exit 2, "could not record the candidate") for a port it fails without
    ``--backward`` (probe round g)."""
    result = _diff(tiny, port("audit_compiled.py").faulty_scripted_scale)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"
    assert result.backward is None
    assert any("gradients not compared" in n for n in result.notes)
