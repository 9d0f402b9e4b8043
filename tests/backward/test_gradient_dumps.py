"""``introspect capture --backward`` and ``diff --candidate-dump PORT --backward``: a port's
gradient file (node.<reference node>, param.<reference weight>) against the reference's."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from introspect.cli.main import main
from introspect.dump.gradients import grads_path


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grads")
    ref = folder / "ref.safetensors"
    argv = ["capture", "--model", "bert-tiny", "--head", "masked-lm", "--backward", "-o",
            str(ref), "--quiet"]
    assert main(argv) == 0
    return ref


def _port(tmp_path, captured, change=None):
    """A 'port' that dumped the reference's own values, one gradient changed by ``change``."""
    port = tmp_path / "port.safetensors"
    shutil.copy(captured, port)
    grads = load_file(str(grads_path(captured)))
    if change:
        change(grads)
    save_file(grads, str(grads_path(port)))
    return port


def test_capture_writes_the_reference_gradients(captured):
    grads = load_file(str(grads_path(captured)))
    assert grads_path(captured).name == "ref.grads.safetensors"
    assert "param.bert.embeddings.word_embeddings.weight" in grads
    assert "param.cls.predictions.decoder.weight" not in grads  # tied: once, first name
    assert any(k.startswith("node.bert_encoder_layer_1") for k in grads)
    assert grads["loss"].ndim == 0 and float(grads["loss"]) > 0


def test_equal_gradients_pass(tmp_path, captured, capsys):
    port = _port(tmp_path, captured)
    argv = ["diff", "--reference-dump", str(captured), "--candidate-dump", str(port),
            "--backward", "--json", str(tmp_path / "d.json"), "--quiet"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "d.json").read_text())["backward"]["passed"]


def test_a_scaled_weight_gradient_fails_with_its_hint(tmp_path, captured, capsys):
    key = "param.bert.encoder.layer.0.output.dense.weight"

    def double(grads):
        grads[key] = grads[key] * 2

    port = _port(tmp_path, captured, double)
    argv = ["diff", "--reference-dump", str(captured), "--candidate-dump", str(port),
            "--backward", "--json", str(tmp_path / "d.json"), "--quiet"]
    assert main(argv) == 1
    b = json.loads((tmp_path / "d.json").read_text())["backward"]
    assert b["first_divergence"]["parameter"] == key.removeprefix("param.")
    assert any("times 2" in h for h in b["first_divergence"]["hints"])


def test_a_zeroed_node_gradient_is_named(tmp_path, captured, capsys):
    def zero(grads):
        name = next(k for k in grads if k.startswith("node.bert_encoder_layer_1_output_dense"))
        grads[name] = torch.zeros_like(grads[name])

    port = _port(tmp_path, captured, zero)
    argv = ["diff", "--reference-dump", str(captured), "--candidate-dump", str(port),
            "--backward", "--json", str(tmp_path / "d.json"), "--quiet"]
    assert main(argv) == 1
    d = json.loads((tmp_path / "d.json").read_text())["backward"]["first_divergence"]
    assert d["reference_node"] == "bert_encoder_layer_1_output_dense"
    assert any("exactly zero in the candidate" in h for h in d["hints"])


def test_missing_gradient_file_is_one_line(tmp_path, captured, capsys):
    port = tmp_path / "port.safetensors"
    shutil.copy(captured, port)
    argv = ["diff", "--reference-dump", str(captured), "--candidate-dump", str(port),
            "--backward"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no gradient file" in err and len(err.strip().splitlines()) == 1
