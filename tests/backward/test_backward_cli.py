"""``introspect diff --backward [--loss FILE.py:NAME]``: exit codes, terminal, reports."""

from __future__ import annotations

import json

import pytest

from introspect.cli.main import main

PORTS = "tests/backward/cli_ports.py"
BASE = ["diff", "--model", "bert-tiny", "--head", "masked-lm", "--backward"]


def test_scratch_passes_and_every_report_has_the_section(tmp_path, capsys):
    assert main([*BASE, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gradient parity holds" in out
    assert "bert.encoder.layer.1.output.dense.weight" in out or "parameter" in out
    report = json.loads((tmp_path / "diff.json").read_text())
    b = report["backward"]
    assert b["passed"] and b["loss"] == "masked-lm" and b["first_divergence"] is None
    assert len(b["parameters"]) >= 39 and {"reference", "candidate", "max_abs_err",
                                            "status"} <= set(b["parameters"][0])
    assert "### Backward" in (tmp_path / "diff.md").read_text()
    assert "<h2>Backward" in (tmp_path / "diff.html").read_text()


def test_a_backward_bug_exits_1_naming_the_node(tmp_path, capsys):
    argv = [*BASE, "--candidate", f"{PORTS}:custom_gelu", "--loss", f"{PORTS}:squares",
            "--json", str(tmp_path / "d.json"), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr()
    text = err.out + err.err
    assert "first backward divergence: bert_encoder_layer_1_intermediate_intermediate_act_fn" \
        in text
    assert text.count("first backward divergence") == 1  # said once, as the last line
    assert text.strip().splitlines()[-1].startswith("first backward divergence: ")
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["first_divergence"]["phase"] == "backward"  # the forward holds: it decided
    assert report["backward"]["loss"] == "user"
    assert report["backward"]["first_divergence"]["reference_node"] == \
        "bert_encoder_layer_1_intermediate_intermediate_act_fn"


@pytest.mark.parametrize("argv, message", [
    (["diff", "--model", "bert-tiny", "--loss", f"{PORTS}:squares"],
     "--loss works with --backward only"),
    ([*BASE, "--loss", "squares"], "expected path/to/file.py:NAME"),
    ([*BASE, "--loss", f"{PORTS}:missing"], f"--loss '{PORTS}:missing': cli_ports.py has no"),
    ([*BASE, "--loss", "tests/backward/nothere.py:loss"], "--loss 'tests/backward/nothere.py"),
    ([*BASE, "--candidate", f"{PORTS}:correct", "--loss", f"{PORTS}:reads_an_attribute"],
     "the loss (reads_an_attribute) raised AttributeError on the candidate's outputs"),
    ([*BASE, "--candidate-dump", "x.safetensors"], "no gradient file"),
])
def test_bad_options_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    said = [line for line in err.strip().splitlines()  # (past the model's own note)
            if not line.startswith("introspect: bert-tiny: random weights")]
    assert message in err and "Traceback" not in err and len(said) == 1, err


def test_without_a_report_the_own_backwards_decide_and_nothing_is_recorded(capsys):
    """No report asked for: the scratch port's PASS is proven from each side's own
    backward (exit 0, the note in the terminal); a bug still exits 1 naming its node, from
    the recorded path the own backward hands over to."""
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert "gradient parity holds" in out and "0 node gradients" in out
    assert "gradients from each model's own backward of its first plain call" in out
    assert main([*BASE, "--candidate", f"{PORTS}:custom_gelu", "--quiet"]) == 1
    err = capsys.readouterr()
    assert "first backward divergence: bert_encoder_layer_1_intermediate_intermediate_act_fn" \
        in err.out + err.err
