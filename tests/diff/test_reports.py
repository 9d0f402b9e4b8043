"""Reports: every file written atomically, the JSON contract, stable Markdown, JUnit per layer.

Golden files live in tests/diff/golden/; after a deliberate change, regenerate them with
``INTROSPECT_UPDATE_GOLDEN=1 pytest tests/diff`` and review the diff.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

import introspect
from introspect.errors import InputError
from introspect.report import SCHEMA_VERSION, markdown_summary, render_reports, write_reports
from tests.fixtures.candidates import inject
from tests.golden import check_golden

GOLDEN = Path(__file__).parent / "golden"
FILES = {"diff.json", "nodes.csv", "layers.csv", "diff.md", "junit.xml", "diff.html"}


@pytest.fixture(scope="module")
def faulty_diff(tiny, port, inputs):
    faulty, _ = inject(port, "tanh-gelu", layer=1)
    return introspect.diff(tiny, faulty, inputs)


def test_markdown_of_a_passing_bert_tiny_diff_is_stable(tiny_diff):
    check_golden(GOLDEN / "bert_tiny_scratch.md", markdown_summary(tiny_diff))


def test_every_report_is_written(faulty_diff, tmp_path):
    paths = write_reports(faulty_diff, tmp_path / "report")
    names = {p.name for p in paths}
    assert FILES <= names
    if shutil.which("dot"):
        assert "diff.svg" in names
        assert "<svg" in (tmp_path / "report" / "diff.svg").read_text()
    assert not list((tmp_path / "report").glob(".*tmp"))  # no temp file left behind


def test_json_holds_the_contract(faulty_diff):
    document = json.loads(render_reports(faulty_diff, drawing=False)["diff.json"])
    assert document["schema_version"] == SCHEMA_VERSION and document["passed"] is False
    assert {"reference_node", "module", "layer"} <= set(document["first_divergence"])
    assert document["first_divergence"]["layer"] == "encoder.layer.1"
    row = document["nodes"][0]
    assert {"reference_node", "candidate_node", "module", "layer", "op", "shape",
            "max_abs_err", "local_max_abs_err", "status"} <= set(row)
    assert {"layer", "max_abs_err", "status"} <= set(document["layers"][0])
    words = {layer["layer"]: layer["status"] for layer in document["layers"]}
    assert words["encoder.layer.0"] == "pass" and words["encoder.layer.1"] == "FAIL"
    assert set(words.values()) <= {"pass", "FAIL", "drift", "n/a"}


def test_one_set_of_status_words_with_a_legend(faulty_diff, tmp_path):
    """Terminal, Markdown, HTML and layers.csv say the same words, each with the legend."""
    from introspect.diff.result import STATUS_LEGEND, layer_statuses

    words = layer_statuses(faulty_diff)
    reports = render_reports(faulty_diff, drawing=False)
    assert STATUS_LEGEND in reports["diff.md"] and STATUS_LEGEND in reports["diff.html"]
    assert "| encoder.layer.1 |" in reports["diff.md"] and "**FAIL** (1)" in reports["diff.md"]
    assert list(faulty_diff.layers["status"]) == words
    write_reports(faulty_diff, tmp_path, drawing=False)
    assert list(pd.read_csv(tmp_path / "layers.csv", keep_default_na=False)["status"]) == words
    assert "hint: the candidate uses the tanh approximation" in reports["diff.md"]
    assert reports["diff.md"].count("tanh approximation of GELU where") == 1  # each hint once


def test_csv_tables_read_back(faulty_diff, tmp_path):
    write_reports(faulty_diff, tmp_path, drawing=False)
    nodes = pd.read_csv(tmp_path / "nodes.csv")
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert (nodes["status"] == "fail").any() and len(layers) == len(faulty_diff.layers)


def test_junit_has_one_case_per_layer_and_fails_the_faulty_one(faulty_diff):
    root = ET.fromstring(render_reports(faulty_diff, drawing=False)["junit.xml"])
    cases = root.findall(".//testcase")
    assert [c.get("name") for c in cases] == list(faulty_diff.layers["layer"])
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["encoder.layer.1"]


def test_html_is_self_contained_and_highlights_failures(faulty_diff):
    page = render_reports(faulty_diff)["diff.html"]
    assert "<script src" not in page and "src=" not in page.replace("xlink:href", "")
    assert "background-color:#f8d7da" in page and "tanh approximation" in page
    notebook = faulty_diff._repr_html_()
    assert "background-color:#f8d7da" in notebook and "parity fails" in notebook


def test_unwritable_folder_is_refused_before_writing(faulty_diff, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InputError, match="is a file"):
        write_reports(faulty_diff, blocker)
    with pytest.raises(InputError, match="does not exist"):
        write_reports(faulty_diff, tmp_path / "no" / "such")
    assert not (tmp_path / "no").exists()
