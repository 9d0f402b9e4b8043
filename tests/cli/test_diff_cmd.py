"""`introspect diff` end to end: exit 0/1/2, report files, one line on bad input."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from introspect.cli.main import main


def test_hf_against_scratch_passes(capsys):
    assert main(["diff", "--model", "bert-tiny", "--head", "sequence-classification"]) == 0
    out = capsys.readouterr().out
    assert "parity holds (max abs error 0;" in out and "encoder.layer.1" in out


def test_failing_parity_exits_1_and_writes_every_report(tmp_path, capsys):
    out_dir, json_path, junit_path = tmp_path / "out", tmp_path / "d.json", tmp_path / "j.xml"
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-dtype",
            "bfloat16", "--out", str(out_dir), "--json", str(json_path), "--junit",
            str(junit_path)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "parity FAILS" in out and "first divergence" in out and "bfloat16" in out
    document = json.loads(json_path.read_text())
    assert document["passed"] is False and document["first_divergence"]["reference_node"]
    assert ET.parse(junit_path).getroot().get("failures") != "0"
    assert {"diff.json", "diff.md", "diff.html", "junit.xml", "nodes.csv",
            "layers.csv"} <= {p.name for p in out_dir.iterdir()}


def test_noise_budget_passes_the_same_comparison(capsys):
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-dtype",
            "bfloat16", "--noise-budget", "-q"]
    assert main(argv) == 0


def test_other_attention_path_passes(capsys):
    assert main(["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-attn",
                 "eager", "-q"]) == 0


@pytest.fixture(scope="module")
def other_size_checkpoint(tmp_path_factory):
    import introspect.scratch as scratch

    folder = tmp_path_factory.mktemp("small")
    config = scratch.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=256)
    scratch.BertModel(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("argv, message", [
    (["--atol", "-1"], "--atol must be a finite number >= 0"),
    (["--rtol", "nan"], "--rtol must be a finite number >= 0"),
    (["--rtol", "abc"], "--rtol must be a number"),
    (["--out", "/no/such/folder/report"], "'/no/such/folder' does not exist"),
    (["--json", "/no/such/folder/d.json"], "folder '/no/such/folder' does not exist"),
    (["--candidate-model", "/no/such/checkpoint"], "'/no/such/checkpoint' does not exist"),
    (["--text", ""], "text 1 is empty"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["diff", "--model", "bert-tiny", "-q", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_different_sizes_exit_2_and_write_nothing(other_size_checkpoint, tmp_path, capsys):
    out_dir = tmp_path / "out"
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-model",
            str(other_size_checkpoint), "--out", str(out_dir), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "another model or size" in err and err.count("\n") == 1
    assert not out_dir.exists()


def test_another_checkpoint_diverges_where_its_weights_differ(tiny_models, tmp_path, capsys):
    import copy

    import torch

    tuned = copy.deepcopy(tiny_models("base", "sdpa").model)
    with torch.no_grad():  # (one output's row: every row shifted alike moves each output
        tuned.encoder.layer[1].output.dense.weight[:1].add_(0.01)  # alike, which the
    tuned.save_pretrained(tmp_path / "tuned")  # LayerNorm after it takes away: a PASS)
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-model",
            str(tmp_path / "tuned")]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "first divergence: encoder_layer_1_output_dense" in out
    assert "encoder.layer.1.output.dense.weight differs" in out
