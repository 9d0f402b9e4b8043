"""The ONNX Runtime recipe says one line for what it cannot use (issue 34, low): a damaged
.onnx, a folder, a capture that is not safetensors; and paths with spaces work. A tiny
ONNX graph with BERT's three inputs stands in for the exported model (seconds, no export).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import launch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "onnx_runtime" / "bert_onnx.py"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return launch.run([sys.executable, *argv], capture_output=True, text=True,
                      timeout=300, env=env)


@pytest.fixture(scope="module")
def spaced(tmp_path_factory):
    """A folder with a space in its name holding a capture and a tiny .onnx model."""
    import onnx
    from onnx import TensorProto, helper

    folder = tmp_path_factory.mktemp("recipe") / "my files"
    folder.mkdir()
    capture = folder / "ref capture.safetensors"
    done = run("-m", "introspect", "capture", "--model", "bert-tiny", "-q", "-o", str(capture))
    assert done.returncode == 0, done.stderr
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["ids", "mask"], ["masked"])]
    output = helper.make_tensor_value_info("masked", TensorProto.FLOAT, ["b", "s"])
    model = helper.make_model(helper.make_graph(nodes, "tiny", inputs, [output]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "tiny model.onnx"))
    (folder / "damaged.onnx").write_bytes(b"not a protobuf at all")
    return folder


def test_paths_with_spaces_work(spaced):
    out = spaced / "ort dump.npz"
    done = run(str(RECIPE), "--capture", str(spaced / "ref capture.safetensors"), "--onnx",
               str(spaced / "tiny model.onnx"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.is_file()


@pytest.mark.parametrize("argv, message", [
    (["--onnx", "damaged.onnx"], "damaged.onnx: ONNX Runtime could not run it (DecodeError"),
    (["--onnx", "."], "a folder; give an exported .onnx model"),
    (["--capture", "ref capture.index.json"], "not a safetensors file"),
    (["--capture", "."], "a folder; give the .safetensors file 'introspect capture' wrote"),
    (["--capture", "tiny model.onnx"], "not a safetensors file"),
])
def test_what_the_recipe_cannot_use_is_one_line_and_exit_2(spaced, argv, message):
    options = {"--capture": "ref capture.safetensors", "--onnx": "tiny model.onnx"}
    options[argv[0]] = argv[1]
    args = [a for option, value in options.items() for a in (option, str(spaced / value))]
    done = run(str(RECIPE), *args, "-o", str(spaced / "never.npz"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("bert_onnx.py: error: ") and message in lines[0]
    assert not (spaced / "never.npz").exists()
