"""`introspect attention` end to end, and its hook in `introspect diff`."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ElementTree

import pytest

from introspect.cli.main import main
from tests.bounds import below


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_head_view_svg_of_the_default_pair(tmp_path, capsys):
    out = tmp_path / "head.svg"
    assert main(["attention", "--model", "bert-tiny", "--heads", "1", "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    text = " ".join(ElementTree.parse(out).getroot().itertext())
    assert "layer 0 · head 1" in text
    assert "time flies like an arrow / fruit flies like a banana" in text
    assert text.count("[SEP]") == 4  # the pair: [CLS] A [SEP] B [SEP], on both sides


@pytest.mark.parametrize("argv, message", [
    (["--layer", "2"], "layer 2 is out of range: bert-tiny has 2 layers (0 to 1)"),
    (["--heads", "0,5"], "head 5 is out of range: bert-tiny has 2 heads (0 to 1)"),
    (["--layer", "-3"], "layer -3 is out of range"),
    (["--text", "  "], "text 1 is empty"),
    (["--text", "a", "--row", "1"], "--row 1 is out of range: the input has 1 row(s)"),
    (["--view", "pie"], "invalid choice: 'pie'"),
    (["--format", "gif"], "invalid choice: 'gif'"),
    (["-o", "picture.gif"], "cannot tell the format of 'picture.gif'"),
    (["--heads", "three"], "expected an index, a list such as 0,3,8, or 'all'"),
    (["--tokens", "9:3"], "--tokens '9:3' is empty"),
    (["--format", "png", "-o", "-"], "png does not go to stdout"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(["attention", "--model", "bert-tiny", *argv])
    except SystemExit as e:  # argparse errors
        code = e.code
    assert code == 2
    assert message in only_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_out_of_range_fails_before_the_model_is_loaded(tmp_path, capsys, monkeypatch):
    import introspect.models.load

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(introspect.models.load, "load_model", refuse)
    assert main(["attention", "--model", "minilm", "--heads", "12", "-o",
                 str(tmp_path / "a.svg")]) == 2
    assert "head 12 is out of range: minilm has 12 heads (0 to 11)" in capsys.readouterr().err


def test_svg_to_stdout_is_byte_stable(capsysbinary):
    argv = ["attention", "--model", "bert-tiny", "--view", "matrix", "--text", "I love cats!",
            "-q", "-o", "-"]
    assert main(argv) == 0
    first = capsysbinary.readouterr().out
    assert main(argv) == 0
    assert capsysbinary.readouterr().out == first and first.startswith(b"<svg")


def test_json_has_per_head_stats_and_the_chosen_maps(capsys):
    assert main(["attention", "--model", "bert-tiny", "--layer", "all", "--heads", "1",
                 "--format", "json", "-q"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["layers"], document["heads"]) == (2, 2)
    assert len(document["stats"]) == 4
    assert set(document["stats"][0]) == {"layer", "head", "entropy", "to_cls", "to_sep",
                                         "to_self", "to_prev", "to_next", "max_weight"}
    assert [(m["layer"], m["head"]) for m in document["maps"]] == [(0, 1), (1, 1)]
    n = len(document["tokens"])
    assert len(document["maps"][0]["weights"]) == n
    # each weight written to 6 decimals: n * 5e-7 off, plus float32's sum (n * 6e-8)
    assert below(abs(sum(document["maps"][0]["weights"][0]) - 1), 1e-4, "row sums to 1")


def test_csv_stats_and_html_page(tmp_path, capsys):
    assert main(["attention", "--model", "bert-tiny", "--format", "csv", "-q"]) == 0
    every = capsys.readouterr().out.splitlines()
    assert every[0].startswith("layer,head,entropy,to_cls") and len(every) == 1 + 2 * 2
    assert main(["attention", "--model", "bert-tiny", "--format", "csv", "--layer", "1",
                 "--heads", "-1", "-q"]) == 0
    chosen = capsys.readouterr().out.splitlines()
    assert chosen[0] == every[0] and [line[:4] for line in chosen[1:]] == ["1,1,"]
    assert main(["attention", "--model", "bert-tiny", "--format", "csv", "--heads", "0",
                 "-q"]) == 0
    assert [line[:4] for line in capsys.readouterr().out.splitlines()[1:]] == ["0,0,", "1,0,"]
    page = tmp_path / "a.html"
    assert main(["attention", "--model", "bert-tiny", "-q", "-o", str(page)]) == 0
    text = page.read_text()
    assert "http://" not in text and "https://" not in text


def test_png_output(tmp_path):
    pytest.importorskip("cairosvg")
    out = tmp_path / "model.png"
    assert main(["attention", "--model", "bert-tiny", "--view", "model", "-q",
                 "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_diff_hook_reports_the_first_divergent_head(tmp_path, tiny_models):
    """The hook `introspect diff` calls: a line for the person, heads.csv and the head's SVG."""
    import io

    import introspect
    from introspect.cli.attention_cmd import (
        head_parity_files,
        head_parity_for_diff,
        print_head_parity,
    )

    from .test_heads import HandPort, swap_query_heads

    hf = tiny_models("base", "sdpa").model
    inputs = introspect.tokenize(tiny_models().tokenizer, ["I love cats!", "He hates pizza."])
    args = argparse.Namespace(out=str(tmp_path), quiet=True, verbose=False, atol=None,
                              rtol=None)
    parity = head_parity_for_diff(hf, swap_query_heads(HandPort(hf), 1, 0, 1), inputs, args)
    stream = io.StringIO()
    print_head_parity(parity, stream, quiet=True)  # a failure is said even with --quiet
    assert "first divergent head: layer 1, head 0" in stream.getvalue()
    files = head_parity_files(parity)
    assert str(files["heads.csv"]).startswith("layer,head,max_abs_err,passed")
    ElementTree.fromstring(files["heads.svg"])


def test_diff_command_prints_the_head_verdict(tmp_path, capsys):
    assert main(["diff", "--model", "bert-tiny", "--out", str(tmp_path / "r")]) == 0
    assert ("attention heads (each head on the reference's inputs to its layer): all 2x2 heads "
            "within budget") in capsys.readouterr().out
    assert (tmp_path / "r" / "heads.csv").exists()
    assert not (tmp_path / "r" / "heads.svg").exists()  # no head diverged


def test_notebook_attention_section_runs(minilm):
    """The cells of section 8 in scripts/build_notebook.py run on the embedded model."""
    import importlib.util
    from pathlib import Path

    import introspect

    path = Path(__file__).resolve().parents[2] / "scripts" / "build_notebook.py"
    spec = importlib.util.spec_from_file_location("build_notebook", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    start = next(i for i, (_, text) in enumerate(module.CELLS) if "## 8. What the heads" in text)
    cells = [text for kind, text in module.CELLS[start:] if kind == "code"]
    namespace = {"introspect": introspect, "hf": minilm}
    for cell in cells:
        *body, last = cell.strip().splitlines()
        exec("\n".join(body), namespace)
        namespace["_"] = eval(last.replace("SVG(", "str(") if last.startswith("SVG(")
                              else last, namespace)
    assert "layer 0" in namespace["maps"].svg("head", layers=[0], heads=[8])
    assert len(namespace["stats"]) == 6 * 12
