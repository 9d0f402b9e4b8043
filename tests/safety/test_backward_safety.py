"""--backward never passes by accident (issue 34, R3 and the high cases): NaN or Inf
losses and gradients, a loss that edits its inputs or is zero, a port under no_grad,
gradient files of another capture, stale gradient files, and oversized gradient reads."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from introspect.cli.main import main
from introspect.diff.backward.parity import _budget, _errors
from introspect.diff.tolerance import Tolerance
from introspect.dump.gradients import compare_gradients, grads_path, read_gradients
from tests.refusals import shows

MISBEHAVES = Path(__file__).resolve().parent / "port_files" / "misbehaves.py"
BASE = ["diff", "--model", "bert-tiny", "-q", "--backward"]


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("loss, value", [("loss_nan", "nan"), ("loss_inf", "inf")])
def test_a_non_finite_loss_is_exit_2_naming_it(loss, value, capsys):
    assert main([*BASE, "--loss", f"{MISBEHAVES}:{loss}"]) == 2
    line = only_line(capsys.readouterr().err)
    assert f"the reference's user loss is {value}: its gradients compare nothing" in line


def test_a_loss_times_zero_is_exit_2(capsys):
    assert main([*BASE, "--loss", f"{MISBEHAVES}:loss_times_zero"]) == 2
    assert "every gradient of the reference's user loss is zero" in \
        only_line(capsys.readouterr().err)


def test_a_loss_that_edits_its_inputs_gets_copies(capsys):
    """It marks the padding real in place: the correct from-scratch BERT still passes."""
    assert main([*BASE, "--loss", f"{MISBEHAVES}:loss_edits_its_inputs"]) == 0, \
        capsys.readouterr()


def test_a_port_whose_forward_runs_under_no_grad_fails(capsys):
    assert main(["diff", "--model", "bert-tiny", "--backward", "--candidate",
                 f"{MISBEHAVES}:no_grad_forward"]) == 1
    out = capsys.readouterr().out
    assert "gradient parity FAILS" in out and "its forward ran under no_grad" in out


def test_the_same_inf_in_both_gradients_fails_and_a_nan_budget_is_finite():
    budget = _budget(Tolerance(), torch.float32, math.nan, math.nan)
    assert math.isfinite(budget.atol) and budget.atol > 0
    g = torch.tensor([1.0, math.inf])
    assert _errors(g, g.clone(), budget)[2]  # over budget
    assert _errors(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 2.0]), budget)[2]
    assert not _errors(g, g.clone(), budget, allow_nonfinite=True)[2]
    assert not _errors(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), budget)[2]


def test_gradient_files_with_the_same_inf_fail_and_a_nan_reference_loss_is_refused():
    ref = {"node.a": torch.tensor([1.0, math.inf]), "param.w": torch.ones(3),
           "loss": torch.tensor(1.5)}
    same = {k: v.clone() for k, v in ref.items()}
    result = compare_gradients(ref, same)
    assert not result.passed and result.rows[0].status == "fail"
    assert compare_gradients(ref, same, allow_nonfinite=True).passed
    with pytest.raises(Exception, match="the reference's gradient file holds a loss of nan"):
        compare_gradients({**ref, "loss": torch.tensor(math.nan)}, same)
    finite = {"param.w": torch.ones(3), "loss": torch.tensor(1.5)}
    assert not compare_gradients(finite, {**finite, "loss": torch.tensor(math.nan)}).passed


# --- Sets: a gradient file belongs to its capture -------------------------------------

@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grads")
    target = folder / "ref.safetensors"
    assert main(["capture", "--model", "bert-tiny", "--head", "masked-lm", "--backward",
                 "-q", "-o", str(target)]) == 0
    return target


def test_a_plain_capture_removes_the_old_gradient_file(tmp_path, captured):
    target = tmp_path / "ref.safetensors"
    target.write_bytes(captured.read_bytes())
    grads_path(target).write_bytes(grads_path(captured).read_bytes())
    assert main(["capture", "--model", "bert-tiny", "-q", "-o", str(target)]) == 0
    assert target.is_file() and not grads_path(target).exists()


def test_a_gradient_file_of_another_capture_is_refused(tmp_path, captured, capsys):
    target = tmp_path / "ref.safetensors"
    assert main(["capture", "--model", "bert-tiny", "--head", "masked-lm", "--text", "other",
                 "-q", "-o", str(target)]) == 0
    grads_path(target).write_bytes(grads_path(captured).read_bytes())  # a mixed set
    port = tmp_path / "port.safetensors"
    port.write_bytes(target.read_bytes())
    grads_path(port).write_bytes(grads_path(captured).read_bytes())
    code = main(["diff", "--reference-dump", str(target), "--candidate-dump", str(port),
                 "--backward", "-q"])
    assert code == 2
    assert "was written for another capture" in only_line(capsys.readouterr().err)


def test_leftover_temps_of_a_killed_capture_are_removed(tmp_path):
    target = tmp_path / "ref.safetensors"
    left = [tmp_path / ".ref.safetensors.0123abcd.tmp",
            tmp_path / ".ref.index.json.89ab4567.old.tmp"]
    for path in left:
        path.write_bytes(b"x" * 100)
    mine = tmp_path / ".other.0123abcd.tmp"
    mine.write_bytes(b"user's")
    assert main(["capture", "--model", "bert-tiny", "-q", "-o", str(target)]) == 0
    assert not any(p.exists() for p in left) and mine.read_bytes() == b"user's"


# --- Bounded reads --------------------------------------------------------------------

def test_a_gradient_zip_bomb_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    import introspect.dump.formats as formats

    monkeypatch.setattr(formats, "_memory_limit", lambda: 1 << 20)
    path = tmp_path / "port.grads.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("param.w.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.zeros(1 << 20, np.float32))  # 4 MiB
    assert path.stat().st_size < 1 << 16
    with pytest.raises(Exception, match="more than half the memory available"):
        read_gradients(path)


def test_a_gradient_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    path = tmp_path / "port.grads.safetensors"
    os.mkfifo(path)
    with pytest.raises(Exception, match="give a regular file|no gradient file"):
        read_gradients(path)


def test_the_labels_idiom_done_in_place_passes(capsys):
    """`labels = inputs["input_ids"]; labels[mask == 0] = -100` edits the ids: on copies."""
    assert main([*BASE, "--head", "masked-lm", "--loss",
                 f"{MISBEHAVES}:labels_in_place"]) == 0, capsys.readouterr()


def test_a_loss_that_adds_a_global_hook_is_exit_2_naming_it(capsys):
    from torch.nn.modules import module

    before = dict(module._global_forward_hooks)
    spec = f"{MISBEHAVES}:loss_adds_a_global_hook"
    assert main([*BASE, "--loss", spec]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("introspect diff: error: --loss '") and shows(spec, line)
    assert "' changed torch's global forward hooks" in line and len(line) < 200
    assert dict(module._global_forward_hooks) == before  # taken out again
