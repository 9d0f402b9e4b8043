"""Every line the real CLI prints fits the terminal, at 60, 80 and 120 columns: tables,
verdicts, hints, notes and legends alike. The one exception is a line holding a single
word that cannot break (a path, a node name). Rows held back say "… and N more"."""

from __future__ import annotations

import pytest

import introspect
from introspect.cli.main import main

PORTS = "tests/backward/cli_ports.py"
TINY = ["--model", "bert-tiny"]
WIDTHS = [60, 80, 120]


def printed(argv: list[str], width: int, monkeypatch, capsys, code: int = 0) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(argv) == code
    return capsys.readouterr().out


def assert_fits(text: str, width: int) -> None:
    too_long = [line for line in text.splitlines()
                if len(line) > width and len(line.split()) > 1]
    assert not too_long, "\n".join(too_long)


@pytest.mark.parametrize("width", WIDTHS)
def test_trace_fits_and_folds_identical_layers(width, monkeypatch, capsys):
    text = printed(["trace", *TINY, "-q"], width, monkeypatch, capsys)
    assert_fits(text, width)
    assert "layer.0–1" in text and "×2" in text  # two identical layers, shown once
    assert "node gradient" not in text and "nodes " in text  # the totals count the nodes


@pytest.mark.parametrize("width", WIDTHS)
def test_trace_depth_is_one_row_per_module(width, monkeypatch, capsys):
    text = printed(["trace", *TINY, "--depth", "2", "-q"], width, monkeypatch, capsys)
    assert_fits(text, width)
    lines = text.splitlines()
    assert any(line.startswith("encoder.layer.0–1") for line in lines)
    assert any(line.startswith("  attention ") for line in lines)
    assert not any(line.startswith("    ") for line in lines[:lines.index("totals")])  # depth 2
    assert "parameters" in text and "4,385,920" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_diff_pass_and_fail_fit(width, monkeypatch, capsys):
    text = printed(["diff", *TINY], width, monkeypatch, capsys)
    assert_fits(text, width)
    assert "parity holds" in text
    failing = printed(["diff", *TINY, "--candidate-dtype", "bfloat16"], width, monkeypatch,
                      capsys, code=1)
    assert_fits(failing, width)
    assert "parity FAILS in the forward" in " ".join(failing.split())
    assert "… and " in failing and " more" in failing  # rows held back say so
    last = max(i for i, line in enumerate(failing.splitlines()) if not line.startswith(" "))
    assert failing.splitlines()[last].startswith("first divergence: ")


@pytest.mark.parametrize("width", [pytest.param(60, marks=pytest.mark.slow), 80,
                                   pytest.param(120, marks=pytest.mark.slow)])
def test_backward_bug_fits_names_the_backward_and_drifts(width, monkeypatch, capsys):
    text = printed(["diff", *TINY, "--head", "masked-lm", "--backward", "--candidate",
                    f"{PORTS}:custom_gelu"], width, monkeypatch, capsys, code=1)
    assert_fits(text, width)
    flat = " ".join(text.split())
    assert "parity FAILS in the backward (the forward holds:" in flat
    assert "first divergence:" not in flat  # the forward holds: only the backward's
    assert "parameters: 42 weights' gradients (0 FAIL, 31 drift)" in flat
    assert "… and 32 more" in flat and "… and 33 more" in flat  # weights, node gradients
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if not line.startswith(" "))
    assert lines[last].startswith("first backward divergence:")


def test_a_passing_backward_ends_on_its_verdict(monkeypatch, capsys):
    text = printed(["diff", *TINY, "--head", "masked-lm", "--backward"], 80, monkeypatch,
                   capsys)
    assert_fits(text, 80)
    assert text.splitlines()[-1] == "parity holds: forward and backward (42 parameters)"
    assert "… and 32 more" in text


@pytest.mark.slow  # ~15 s: llama-tiny decoding
@pytest.mark.parametrize("width", WIDTHS)
def test_generate_fits(width, monkeypatch, capsys):
    from tests.generate.conftest import ROOT

    port = ROOT / "tests" / "generate" / "llama_static.py"
    text = printed(["diff", "--model", "llama-tiny", "--head", "causal-lm", "--text",
                    "The cat sat on", "--candidate", f"{port}:build_gqa_tiled", "--generate",
                    "2"], width, monkeypatch, capsys, code=1)
    assert_fits(text, width)
    assert "parity FAILS at step 1" in " ".join(text.split())
    assert "firs…" not in text  # headers fold, never cut


def test_backward_only_failure_decides_first_divergence(tiny_models):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(PORTS).parent))
    import cli_ports  # type: ignore[import-not-found]

    loaded = tiny_models("masked-lm", "sdpa")
    result = introspect.diff(loaded.model, cli_ports.custom_gelu(loaded),
                             introspect.tokenize(loaded.tokenizer), backward=True)
    d = result.first_divergence
    assert not result.passed and result.failed_in == "backward"
    assert d is not None and d.phase == "backward"
    assert d.reference_node == "bert_encoder_layer_1_intermediate_intermediate_act_fn"
    assert d == result.first_divergence  # the one the backward found
    assert d.reference_node == result.backward.first_divergence.reference_node
    words = {r.status for r in result.backward.parameter_rows}
    assert words <= {"ok", "drift"} and "drift" in words  # carried in from layer 1's GELU


def test_summary_and_repr_have_totals(tiny_models):
    loaded = tiny_models("base", "sdpa")
    graph = introspect.trace(loaded.model, introspect.tokenize(loaded.tokenizer))
    count = sum(p.numel() for p in loaded.model.parameters())
    assert graph.total_params == count
    assert f"{count:,} parameters" in repr(graph) and f"{len(graph.records)} nodes" in repr(graph)
    text = graph.summary(depth=1, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("encoder.layer.0–1 ×2") for line in lines)
    assert f"{count:,}" in text and "FLOPs" in text
    assert str(graph) == graph.summary()
    unfolded = graph.summary(depth=1, fold=False)
    assert "encoder.layer.1 " in unfolded and "×" not in unfolded
