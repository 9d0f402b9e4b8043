"""`introspect trace` end to end: formats, files, and one line + exit 2 on bad input."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pandas as pd
import pytest

from introspect.cli.main import main
from tests import launch

CLI_DIR = Path(__file__).resolve().parents[2] / "introspect" / "cli"
HEAVY = {"torch", "transformers", "pandas", "networkx", "graphviz", "numpy", "rich"}


def test_table_lists_nodes_with_shapes(capsys):
    assert main(["trace", "--model", "bert-tiny", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "\n     embeddings\n" in out  # a heading per layer
    assert "  position_embeddings " in out and "(1, 8, 128)" in out
    assert "shape-bookkeeping nodes" in out


def test_csv_json_graphml_files(tmp_path, capsys):
    csv_path, json_path, graphml_path = (tmp_path / f"g.{ext}"
                                         for ext in ("csv", "json", "graphml"))
    for fmt, path in (("csv", csv_path), ("json", json_path), ("graphml", graphml_path)):
        assert main(["trace", "--model", "bert-tiny", "--head", "sequence-classification",
                     "--text", "I love cats!", "--format", fmt, "-o", str(path), "-q"]) == 0
    nodes = pd.read_csv(csv_path)
    assert {"name", "layer", "module", "shapes", "flops", "kind"} <= set(nodes.columns)
    document = json.loads(json_path.read_text())
    assert document["tokens"] == [["[CLS]", "i", "love", "cats", "!", "[SEP]"]]
    assert document["outputs"] == ["logits"] and document["schema_version"] == 1
    graph = nx.read_graphml(graphml_path)
    assert graph.nodes["classifier"]["shape"] == "(1, 2)"


def test_same_inputs_give_identical_files(tmp_path):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        main(["trace", "--model", "bert-tiny", "--format", "json", "-o", str(path), "-q"])
    assert paths[0].read_bytes() == paths[1].read_bytes()


@pytest.mark.parametrize("argv, message", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "bert-tiny", "--text", ""], "text 1 is empty"),
    (["--model", "bert-tiny", "-o", "/no/such/folder/x.csv", "--format", "csv"],
     "folder '/no/such/folder' does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["trace", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_usage_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["trace", "--head", "summarise"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'summarise'" in err and err.count("\n") == 1


def test_folder_that_is_not_bert_through_the_real_cli(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "t5"}')
    done = launch.run([sys.executable, "-m", "introspect", "trace", "--model", str(tmp_path)],
                      capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("holds a t5 model; supported checkpoints: model_type "
                                        "bert, roberta, distilbert, electra, albert, gpt2, "
                                        "llama")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_help_does_not_import_heavy_packages():
    code = ("import sys; from introspect.cli.main import build_parser; build_parser(); "
            f"print(sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("path", sorted(CLI_DIR.glob("*.py")), ids=lambda p: p.name)
def test_cli_modules_import_no_heavy_package_at_top_level(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:  # top level only: imports inside functions are lazy
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in HEAVY, f"{path.name} imports {name} at start-up"
            if name.startswith("introspect.") and not name.startswith("introspect.cli"):
                assert name in ("introspect.errors", "introspect.version", "introspect"), \
                    f"{path.name}: {name}"


def test_the_initialised_head_is_said_only_under_verbose(tmp_path, capsys):
    path = tmp_path / "n.csv"
    argv = ["trace", "--head", "sequence-classification", "--format", "csv", "-o", str(path)]
    assert main(argv) == 0
    assert capsys.readouterr().err == f"introspect: wrote {path}\n"  # one line, no seed note
    assert main([*argv, "--verbose"]) == 0
    assert "2 weights not in the checkpoint were initialised with seed 0: classifier.bias" \
        in capsys.readouterr().err
