"""`introspect diff --repro DIR` and `DiffResult.write_repro`: a script that reproduces a
divergence with torch alone, run here in a fresh process, in another folder, where
neither introspect nor transformers can be imported."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from introspect.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FAULTY_PORT = ROOT / "examples" / "ci" / "faulty_port.py"


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory):
    """The README's faulty port (a tanh GELU in the last layer) diffed with --repro."""
    folder = tmp_path_factory.mktemp("run")
    repro, report = folder / "repro", folder / "diff.json"
    code = main(["diff", "--model", "bert-tiny", "--candidate", f"{FAULTY_PORT}:build",
                 "--repro", str(repro), "--json", str(report), "--quiet"])
    return code, repro, json.loads(report.read_text())


def _run_alone(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python repro.py`` where importing introspect or transformers fails loudly."""
    blockers = cwd / "blocked"
    for name in ("introspect", "transformers"):
        (blockers / name).mkdir(parents=True, exist_ok=True)
        (blockers / name / "__init__.py").write_text(
            f"raise ImportError('the repro imported {name}')\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(blockers),
           "HOME": str(cwd)}
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_failing_diff_writes_the_two_files(failing_run):
    code, repro, report = failing_run
    assert code == 1 and report["passed"] is False
    assert sorted(p.name for p in repro.iterdir()) == ["inputs.safetensors", "repro.py"]


def test_the_script_imports_torch_and_safetensors_only(failing_run):
    _, repro, _ = failing_run
    tree = ast.parse((repro / "repro.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported == {"json", "sys", "pathlib", "torch", "safetensors"}


def test_the_script_reproduces_the_divergence_alone(failing_run, tmp_path):
    _, repro, report = failing_run
    moved = tmp_path / "attached-to-a-bug-report"
    shutil.copytree(repro, moved)  # only the two files: nothing points back here
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _run_alone(moved / "repro.py", elsewhere)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    measured = report["first_divergence"]["local_max_abs_err"]
    assert lines[:2] == [
        "reference: hf BertModel (bert-tiny, sdpa), node encoder_layer_1_intermediate_"
        "intermediate_act_fn (transformers.activations.GELUActivation, in "
        "encoder.layer.1.intermediate.intermediate_act_fn)",
        f"candidate: {FAULTY_PORT}:build, node blocks_1_act (torch.nn.modules.activation.GELU"
        ", module blocks.1.act)"]
    lines = lines[2:]
    assert lines == [
        "reference op, max abs error against its recorded output: 0 (bit-identical)",
        "candidate op, max abs error against its recorded output: 0 (bit-identical)",
        lines[2],
        "FAIL: the two ops part here"]
    assert lines[2].startswith(f"candidate vs reference at the divergence: max abs difference "
                               f"{measured:.6g} (introspect measured {measured:.6g}); ")
    assert lines[2].endswith("element(s) over budget atol 1e-05 + rtol 1.3e-06 * |ref|")
    assert done.stderr == ""


def test_the_script_writes_both_ops_and_names_them_as_data(failing_run):
    from safetensors import safe_open

    _, repro, report = failing_run
    text = (repro / "repro.py").read_text()
    d = report["first_divergence"]
    assert d["reference_node"] == "encoder_layer_1_intermediate_intermediate_act_fn"
    assert "torch.nn.functional.gelu(T['reference.0'])" in text
    assert "torch.nn.functional.gelu(T['candidate.0'], approximate='tanh')" in text  # the bug
    for name in ("GELUActivation", "blocks", "encoder", "faulty_port", "bert-tiny"):
        assert name not in text  # names are data, never the program's text
    with safe_open(str(repro / "inputs.safetensors"), framework="pt") as stored:
        about = json.loads(stored.metadata()["introspect.repro"])
    assert about["reference"]["what"] == "transformers.activations.GELUActivation"
    assert about["candidate"]["module"] == "blocks.1.act"
    assert about["inputs"]["reference.0"] == "reference.encoder_layer_1_intermediate_dense"


def test_the_same_result_gives_the_same_bytes(tiny_models):
    import introspect
    from introspect.diff.repro import repro_files

    sys.path.insert(0, str(FAULTY_PORT.parent))
    try:
        import faulty_port
    finally:
        sys.path.remove(str(FAULTY_PORT.parent))
    loaded = tiny_models("base", "sdpa")
    result = introspect.diff(loaded.model, faulty_port.build(loaded),
                             introspect.tokenize(loaded.tokenizer))
    assert not result.passed
    assert repro_files(result) == repro_files(result)


def test_a_passing_diff_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "repro"
    assert main(["diff", "--model", "bert-tiny", "--repro", str(folder)]) == 0
    assert not folder.exists()
    assert "repro: nothing to reproduce: parity holds" in capsys.readouterr().out


def test_write_repro_on_a_pass_says_why_and_writes_nothing(tiny_models, tmp_path):
    import introspect
    from introspect.diff.repro import NothingToReproduce

    loaded = tiny_models("base", "sdpa")
    port = introspect.scratch.BertModel.from_hf(loaded.model)
    result = introspect.diff(loaded.model, port, introspect.tokenize(loaded.tokenizer))
    with pytest.raises(NothingToReproduce, match="nothing to reproduce: parity holds"):
        result.write_repro(tmp_path / "repro")
    assert not (tmp_path / "repro").exists()


@pytest.mark.parametrize("extra, message", [
    (["--backward"], "--repro does not mix with --backward"),
    (["--generate", "2", "--model", "gpt2", "--head", "causal-lm", "--candidate", "hf"],
     "--repro does not mix with --generate"),
    (["--nproc", "2", "--candidate", f"{FAULTY_PORT}:build"], "--repro does not mix with --nproc"),
    (["--candidate-dump", "x.safetensors"], "--repro does not mix with --candidate-dump"),
])
def test_modes_it_cannot_serve_are_refused(extra, message, tmp_path, capsys):
    folder = tmp_path / "repro"
    assert main(["diff", "--model", "bert-tiny", "--repro", str(folder), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not folder.exists()


@pytest.mark.parametrize("make, message", [
    (lambda tmp: (tmp / "a-file").write_text("x") and tmp / "a-file", "is a file"),
    (lambda tmp: tmp / "no" / "such" / "parent", "does not exist"),
    (lambda tmp: "-", "--repro takes a folder"),
])
def test_a_bad_folder_is_one_line_and_exit_2(make, message, tmp_path, capsys):
    folder = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["diff", "--model", "bert-tiny", "--repro", str(folder)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_is_refused_before_the_diff(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(["diff", "--model", "bert-tiny", "--repro", str(locked / "r")]) == 2
    finally:
        locked.chmod(0o700)
    assert "not writable" in capsys.readouterr().err
