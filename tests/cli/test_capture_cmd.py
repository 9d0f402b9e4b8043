"""introspect capture, and diff --candidate-dump and --reference-dump, as users run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch

EXAMPLE = Path(__file__).parents[2] / "examples" / "numpy_port" / "bert_numpy.py"


def introspect(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return launch.run([sys.executable, "-m", "introspect", *args], cwd=cwd,
                      capture_output=True, text=True)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A capture of bert-tiny and a dump written from it, made once through the CLI."""
    folder = tmp_path_factory.mktemp("capture")
    done = introspect("capture", "--model", "bert-tiny", "-o", "ref.safetensors", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder


def test_capture_writes_the_file_its_index_and_says_the_size(workspace):
    assert (workspace / "ref.safetensors").stat().st_size > 0
    index = json.loads((workspace / "ref.index.json").read_text())
    assert index["format"] == "introspect-capture" and index["tensors"]
    assert (workspace / "ref.index.csv").read_text().startswith("name,index,module,layer")


def test_capture_says_how_large_the_file_is(tmp_path):
    done = introspect("capture", "--model", "bert-tiny", "--select", "layers", "-o",
                      "layers.safetensors", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "wrote 4 tensors" in done.stderr and "KiB" in done.stderr


def test_a_capture_round_trips_against_the_live_model(workspace):
    done = introspect("diff", "--model", "bert-tiny", "--reference-dump", "ref.safetensors",
                      "--candidate", "hf", cwd=workspace)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity holds (max abs error 0;" in done.stdout


def test_a_capture_against_itself_as_a_dump_and_its_reports(workspace):
    done = introspect("diff", "--reference-dump", "ref.safetensors", "--candidate-dump",
                      "ref.safetensors", "--out", "report", cwd=workspace)
    assert done.returncode == 0, done.stdout + done.stderr
    written = sorted(p.name for p in (workspace / "report").iterdir())
    assert written == ["diff.html", "diff.json", "diff.md", "junit.xml", "layers.csv",
                       "nodes.csv"]  # no drawing: a dump has no graph


@pytest.mark.parametrize("args, message", [
    (["--candidate-dump", "missing.npz"], "dump 'missing.npz' does not exist"),
    (["--candidate-dump", "ref.index.json"], "expected a .safetensors or .npz"),
    (["--reference-dump", "ref.index.json", "--candidate", "hf"], "expected a .safetensors"),
    (["--reference-dump", "ref.safetensors", "--text", "other"], "a capture holds its own"),
])
def test_bad_dumps_are_one_line_and_exit_2(workspace, args, message):
    done = introspect("diff", "--model", "bert-tiny", *args, cwd=workspace)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_capture_refuses_bad_options_before_loading(tmp_path):
    done = introspect("capture", "-o", "ref.npz", cwd=tmp_path)
    assert done.returncode == 2 and "capture writes .safetensors" in done.stderr
    done = introspect("capture", "--model", "bert-tiny", "--layers", "9", "-o",
                      "ref.safetensors", cwd=tmp_path)
    assert done.returncode == 2 and "no layer 'encoder.layer.9'" in done.stderr
    assert not list(tmp_path.iterdir())


def test_the_numpy_port_recipe_of_the_readme(tmp_path):
    """capture, run the NumPy port, diff: passes; with a fault, fails at the right tensor."""
    assert introspect("capture", "-o", "ref.safetensors", cwd=tmp_path).returncode == 0
    for fault in (None, "gelu-tanh"):
        port = subprocess.run([sys.executable, str(EXAMPLE), "--capture", "ref.safetensors",
                               "-o", "port.npz", *(["--fault", fault] if fault else [])],
                              cwd=tmp_path, capture_output=True, text=True)
        assert port.returncode == 0, port.stderr
        done = introspect("diff", "--reference-dump", "ref.safetensors", "--candidate-dump",
                          "port.npz", "--quiet", cwd=tmp_path)
        if fault is None:
            assert done.returncode == 0, done.stdout + done.stderr
        else:
            assert done.returncode == 1
            summary = introspect("diff", "--reference-dump", "ref.safetensors",
                                 "--candidate-dump", "port.npz", cwd=tmp_path).stdout
            assert "-> L3.gelu" in summary
