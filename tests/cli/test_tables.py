"""Terminal tables fit the terminal: every line at most 100 columns, names cut with an
ellipsis (never wrapped), errors first, FAIL in red on a terminal, "… and N more"."""

from __future__ import annotations

import argparse
import io

import pytest

import introspect
from introspect.cli.diff_view import print_diff
from introspect.cli.tables import console_for, shorten
from introspect.cli.trace_cmd import print_table
from tests.fixtures.candidates import inject

WIDTH = 100


@pytest.fixture(scope="module")
def failing(tiny_models):
    loaded = tiny_models("base", "sdpa")
    port = introspect.scratch.BertModel.from_hf(loaded.model)
    faulty, _ = inject(port, "intermediate-bias", layer=0)  # every later node drifts or fails
    return introspect.diff(loaded.model, faulty, introspect.tokenize(loaded.tokenizer))


@pytest.fixture(scope="module")
def many_failing(tiny_models):
    """HF against itself in bfloat16: rounding puts most nodes over the float32 budget."""
    import copy

    import torch

    loaded = tiny_models("base", "sdpa")
    cast = copy.deepcopy(loaded.model).to(torch.bfloat16)
    return introspect.diff(loaded.model, cast, introspect.tokenize(loaded.tokenizer))


def rendered(result, **options) -> str:
    stream = io.StringIO()
    print_diff(result, stream, quiet=False, width=WIDTH, **options)
    return stream.getvalue()


def last_paragraph(lines: list[str]) -> list[str]:
    """The last line that does not continue another (prose continues indented), and after."""
    start = max(i for i, line in enumerate(lines) if not line.startswith("    "))
    return lines[start:]


def test_failing_diff_fits_100_columns_with_errors_first(failing):
    text = rendered(failing, all_nodes=False)
    lines = text.splitlines()
    assert last_paragraph(lines)[0].startswith(
        "first divergence: encoder_layer_0_intermediate_dense")
    assert max(len(line) for line in lines) <= WIDTH, text  # prose wrapped too
    assert sum(line.startswith("  hint: ") for line in lines) == 1  # once, under the verdict
    assert "drift   encoder.layer.1" in text  # output over budget, every local error within
    assert "status: pass: compared, within budget; FAIL:" in text  # the legend
    assert "parity FAILS in the forward" in lines[0] + lines[1]
    header = [line for line in lines if line.startswith("status ")]
    assert "local_max_" in text and "max_abs_" in text  # the DataFrame's names, folded
    assert header
    assert "FAIL    encoder.layer.0" in text  # the layer table
    failing_rows = [line for line in lines if line.startswith("FAIL ")]
    assert any("encoder_layer_0_intermediate_dense" in line for line in failing_rows)


def test_capped_rows_say_how_many_more(many_failing):
    text = rendered(many_failing, all_nodes=False)
    over = len(many_failing.failing)
    assert over > 20
    assert f"… and {over - 20} more (--nodes lists every node" in text


def test_every_node_with_nodes_still_fits(many_failing):
    text = rendered(many_failing, all_nodes=True)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    assert "… and" not in text and "compared nodes" in text


def test_fail_is_red_on_a_terminal(failing):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    print_diff(failing, stream, quiet=False, all_nodes=False, width=WIDTH)
    assert "\x1b[1;31mFAIL" in stream.getvalue()
    plain = io.StringIO()
    print_diff(failing, plain, quiet=False, all_nodes=False, width=WIDTH)
    assert "\x1b[" not in plain.getvalue()  # piped: plain text


@pytest.fixture(scope="module")
def minilm_graph(minilm):
    return introspect.trace(minilm.model, introspect.tokenize(minilm.tokenizer))


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("layers", [False, True])
def test_trace_tables_fit_and_never_cut_a_number(minilm_graph, width, layers):
    """Through rich at a fixed width: every line fits, no cell is cut, every number whole."""
    import re

    from introspect.cli.trace_cmd import totals

    stream = io.StringIO()
    print_table(minilm_graph, argparse.Namespace(layers=layers, all=False), width=width,
                stream=stream)
    text = stream.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text  # folded, never cut
    numbers = set(re.findall(r"\d[\d,]*\d", text))
    assert "11,720,448" in numbers or layers  # the word embeddings, whole
    expected = {f"{r.params:,}" for r in minilm_graph.records if r.params} if not layers else \
        {f"{r.params:,}" for r in minilm_graph.layers.itertuples() if r.params}
    expected |= {f"{r.flops:,}" for r in minilm_graph.records if r.flops} if not layers else set()
    expected |= {f"{n:,}" for _, n, _ in totals(minilm_graph) if n >= 10}
    assert expected <= numbers, expected - numbers
    if layers:
        assert "encoder.layer.5" in text
    else:  # six identical layers, shown once
        assert "encoder.layer.0–5" in text and "×6" in text and "encoder.layer.3" not in text


def test_trace_totals_are_torchinfos(minilm_graph, minilm):
    import torch

    from introspect.cli.trace_cmd import totals

    rows = {label: (number, remark) for label, number, remark in totals(minilm_graph)}
    count = sum(p.numel() for p in minilm.model.parameters())  # the pooler runs: all are used
    assert rows["parameters"][0] == rows["trainable parameters"][0] == count
    assert rows["parameter bytes"] == (4 * count, f"{4 * count / 1e6:.3g} MB, float32")
    assert rows["input bytes"] == (3 * 2 * 8 * 8, "2 x 8 tokens")  # three int64 (2, 8) inputs
    linear_flops = sum(2 * 2 * 8 * m.in_features * m.out_features  # 2 x M x N x K per Linear
                       for name, m in minilm.model.named_modules()
                       if isinstance(m, torch.nn.Linear) and not name.startswith("pooler"))
    attention = 6 * 4 * 2 * 12 * 8 * 8 * 32  # QK^T and PV, 6 layers
    pooler = 2 * 2 * 384 * 384
    assert rows["FLOPs"][0] == linear_flops + attention + pooler


def test_trace_file_matches_the_terminal(tmp_path, monkeypatch, capsys):
    from introspect.cli.main import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["trace", "--model", "bert-tiny", "-q"]) == 0
    shown = capsys.readouterr().out
    path = tmp_path / "t.txt"
    assert main(["trace", "--model", "bert-tiny", "-o", str(path)]) == 0
    assert path.read_text() == shown
    assert capsys.readouterr().err.endswith(f"introspect: wrote {path}\n")
    assert max(len(line) for line in shown.splitlines()) <= 80


@pytest.mark.parametrize("text, width, expected", [
    ("attention_output_layer_norm", 18, "attention_output_\nlayer_norm"),
    ("last_hidden_state=(2, 8, 384), pooler_output=(2, 384)", 16,
     "last_hidden_\nstate=(2, 8,\n384), pooler_\noutput=(2, 384)"),
    ("GELUActivation", 5, "GELU\nActiv\nation"),  # at the case change first
    ("short", 20, "short"),
])
def test_fold_keeps_every_character(text, width, expected):
    from introspect.cli.tables import fold

    folded = fold(text, width)
    assert folded == expected and max(len(line) for line in folded.splitlines()) <= width


@pytest.mark.parametrize("name, layer, label", [
    ("bert_encoder_layer_3_attention_self_query", "encoder.layer.3", "attention_self_query"),
    ("embeddings_word_embeddings", "embeddings", "word_embeddings"),
    ("add_17", "encoder.layer.5", "add_17"),
    ("encoder_layer_1", "encoder.layer.1", "encoder_layer_1"),  # nothing left: kept whole
    ("xencoder_layer_1_dense", "encoder.layer.1", "xencoder_layer_1_dense"),
])
def test_node_label(name, layer, label):
    from introspect.cli.trace_cmd import node_label

    assert node_label(name, layer) == label


@pytest.mark.parametrize("text, width, cut, expected", [
    ("encoder_layer_0_attention_output_dense", 20, "start", "…output_dense"),  # whole words
    ("encoder_layer_0_attention_output_dense", 30, "middle", "encoder_…output_dense"),
    ("GELUActivation", 9, "middle", "GELU\nActivatio\nn"),  # no word fits: folded, nothing cut
    ("short", 20, "start", "short"),
])
def test_shorten(text, width, cut, expected):
    assert shorten(text, width, cut) == expected
    assert max(len(line) for line in expected.splitlines()) <= width


def test_pipe_width_follows_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert console_for(io.StringIO()).width == 100
    monkeypatch.delenv("COLUMNS")
    assert console_for(io.StringIO()).width == 120


def test_layer_status_words():
    """pass only where something was compared; drift where only the output is over budget;
    unconfirmed where a node's guessed pair is over budget."""
    from types import SimpleNamespace

    from introspect.diff.records import LayerDiff
    from introspect.diff.result import layer_statuses, status_legend

    def layer(name, nodes, failing, output=""):
        return LayerDiff(name, output, 0.1, 0.0, "", nodes, failing, 0, not failing)

    result = SimpleNamespace(
        layer_rows=[layer("mask", 0, 0), layer("a", 3, 1, "a_out"), layer("b", 3, 0, "b_out"),
                    layer("c", 3, 0, "c_out"), layer("d", 3, 0, "d_out")],
        rows=[SimpleNamespace(reference_node="b_out", status="drift", layer="b"),
              SimpleNamespace(reference_node="c_out", status="ok", layer="c"),
              # a node over budget on a guessed pair: its layer is no "pass" (probe round
              # n: a generation step's second layer with the first one's fault read pass)
              SimpleNamespace(reference_node="d_act", status="unconfirmed", layer="d"),
              SimpleNamespace(reference_node="d_out", status="ok", layer="d")])
    assert layer_statuses(result) == ["n/a", "FAIL", "drift", "pass", "unconfirmed"]
    assert "unconfirmed" not in status_legend(["pass"])
    assert "unconfirmed: " in status_legend(["unconfirmed"])


@pytest.mark.parametrize("width", [40, 60, 80, 100, 200])
@pytest.mark.parametrize("quiet", [True, False])
def test_the_last_line_names_the_layer_and_the_node_at_any_width(failing, width, quiet):
    # at 100 columns the sentence used to wrap so that its last line was only the budget
    # ("1e-05 + rtol 1.3e-06 * |ref|"): a CI log's tail lost the layer
    d = failing.first_divergence
    stream = io.StringIO()
    print_diff(failing, stream, quiet=quiet, all_nodes=False, width=width)
    last = stream.getvalue().rstrip("\n").splitlines()[-1]
    assert d.layer in last and d.reference_node in last, last
    assert d.layer == "encoder.layer.0" and d.reference_node == "encoder_layer_0_intermediate_dense"
