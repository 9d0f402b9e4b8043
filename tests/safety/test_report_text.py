"""Text from users reaches the reports as text (issue 34, low): formulas in CSV cells,
control characters in SVG, a folder named like the page's placeholders."""

from __future__ import annotations

import csv
import dataclasses
import io
import xml.dom.minidom
from pathlib import Path

import pandas as pd

import introspect
from introspect.attention.page import html_page
from introspect.cli.main import main
from introspect.csv_cells import csv_text

MISBEHAVES = Path(__file__).resolve().parent / "port_files" / "misbehaves.py"


def test_csv_cells_that_a_spreadsheet_would_run_are_quoted():
    frame = pd.DataFrame({"name": ["=cmd|' /C calc'!A0", "+SUM(A1)", "@x", "-abc", "plain",
                                   "-", "\tx"],
                          "err": [-1.5, 0.0, 1e-5, -2e-5, 1.0, 2.0, 3.0]})
    rows = list(csv.reader(io.StringIO(csv_text(frame))))[1:]
    assert [r[0] for r in rows] == ["'=cmd|' /C calc'!A0", "'+SUM(A1)", "'@x", "'-abc",
                                    "plain", "-", "'\tx"]
    assert [float(r[1]) for r in rows] == [-1.5, 0.0, 1e-5, -2e-5, 1.0, 2.0, 3.0]


def test_a_port_s_formula_name_is_quoted_in_nodes_csv(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["diff", "--model", "bert-tiny", "-q", "--candidate",
                 f"{MISBEHAVES}:formula_named", "--out", str(out)]) == 0
    cells = [c for row in csv.reader(io.StringIO((out / "nodes.csv").read_text()))
             for c in row]
    assert any("=cmd|" in c for c in cells)
    assert not any(c.startswith("=") for c in cells)


def test_control_characters_in_a_text_give_well_formed_svg(tmp_path, capsys):
    text = "a\x01b\x1bc\x7f\ufffe"
    for command in ("attention", "draw"):
        target = tmp_path / f"{command}.svg"
        assert main([command, "--model", "bert-tiny", "--text", text, "-o", str(target)]) == 0
        xml.dom.minidom.parse(str(target))  # raises on a document that is not well-formed


def test_a_title_holding_the_page_placeholders_stays_text(tiny_models):
    loaded = tiny_models("base")
    maps = introspect.attention(loaded.model, introspect.tokenize(loaded.tokenizer))
    page = html_page(dataclasses.replace(maps, title="__DATA__ and __TITLE__"))
    title = page.split("<title>", 1)[1].split("</title>", 1)[0]
    assert title == "attention: __DATA__ and __TITLE__"
    assert page.count('<script type="application/json" id="data">') == 1

