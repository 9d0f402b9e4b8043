"""The runtime recipes run as a user runs them: a fresh process, then `introspect diff`.

Each skips where its runtime is not installed (``pip install .[onnx]``, ``.[keras]``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROOT = EXAMPLES.parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KERAS_BACKEND": "jax",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return launch.run([sys.executable, *argv], capture_output=True, text=True, timeout=600,
                      env=env)


def needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


@pytest.fixture(scope="module")
def minilm_capture_file(tmp_path_factory):
    """`introspect capture`, as the recipes' first step says."""
    path = tmp_path_factory.mktemp("capture") / "ref.safetensors"
    done = run("-m", "introspect", "capture", "-o", str(path))
    assert done.returncode == 0, done.stderr
    return path


def diff(capture: Path, dump: Path) -> subprocess.CompletedProcess[str]:
    return run("-m", "introspect", "diff", "--reference-dump", str(capture),
               "--candidate-dump", str(dump), "--quiet")


@pytest.mark.slow
def test_the_onnx_runtime_recipe_dumps_what_introspect_diff_reads(minilm_capture_file,
                                                                   tmp_path):
    needs("onnxruntime", "onnx")
    out = tmp_path / "ort.npz"
    done = run(str(EXAMPLES / "onnx_runtime" / "bert_onnx.py"), "--capture",
               str(minilm_capture_file), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"to {out}" in done.stderr
    verdict = diff(minilm_capture_file, out)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "parity holds" in verdict.stdout, verdict.stdout


def test_the_onnx_recipe_refuses_fp16_without_the_shipped_graph(tmp_path):
    needs("onnxruntime", "onnx")
    done = run(str(EXAMPLES / "onnx_runtime" / "bert_onnx.py"), "--capture", "x", "-o",
               str(tmp_path / "o.npz"), "--fp16")
    assert done.returncode == 2
    assert "add --expose shipped" in done.stderr
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.slow
def test_the_keras_recipe_dumps_what_introspect_diff_reads(minilm_capture_file, tmp_path):
    needs("keras", "jax")
    out = tmp_path / "keras.npz"
    done = run(str(EXAMPLES / "keras_jax" / "bert_keras.py"), "--capture",
               str(minilm_capture_file), "-o", str(out), "--fault", "gelu-tanh")
    assert done.returncode == 0, done.stderr
    assert "backend jax" in done.stderr
    verdict = diff(minilm_capture_file, out)
    assert verdict.returncode == 1, verdict.stdout + verdict.stderr
    assert "block3.gelu" in verdict.stdout, verdict.stdout


@pytest.mark.slow
def test_the_readmes_shipped_graph_command_passes(minilm_capture_file, tmp_path):
    """The README's command: ORT's fused graph (transformer optimizer, level all) dumped."""
    needs("onnxruntime", "onnx")
    out = tmp_path / "ort.npz"
    done = run(str(EXAMPLES / "onnx_runtime" / "bert_onnx.py"), "--capture",
               str(minilm_capture_file), "-o", str(out), "--expose", "shipped", "--level", "all",
               "--transformer-optimizer")
    assert done.returncode == 0, done.stderr
    assert "--expose shipped --level all --transformer-optimizer" in \
        (ROOT / "docs" / "dumps.md").read_text().replace("\\\n    ", "")
    verdict = diff(minilm_capture_file, out)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
