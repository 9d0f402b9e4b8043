"""Smoke run of the benchmark harness: bert-tiny at 2 x 9, one run of everything.

Benchmarks are not tests: nothing here asserts a time. This only proves that
``python -m benchmarks`` still runs end to end and writes the report's rows and columns.
"""

from __future__ import annotations

import csv
from dataclasses import fields

import pytest
import torch

from benchmarks import __main__ as bench_cli
from benchmarks.records import GRID, GROWTH, OK, STARTUP, Measurement

pytestmark = [pytest.mark.bench,
              pytest.mark.xdist_group("bench_harness")]  # one worker runs the harness once

GRID_TASKS = {
    ("plain forward", "HF"),
    ("plain forward", "introspect.scratch"),
    ("trace (fx graph)", "introspect"),
    ("trace + shapes", "introspect"),
    ("trace + shapes", "torch.export + ShapeProp"),
    ("trace + shapes", "torchinfo.summary (module outputs only)"),
    ("trace, every node on FakeTensors (no shortcut, no cache)", "introspect"),
    ("trace, cache hit in memory", "introspect"),
    ("drawing, folded (from a traced graph)", "introspect"),
    ("drawing, every node (from a traced graph)", "introspect"),
    ("model to SVG, module level", "introspect"),
    ("model to SVG, module level", "torchview depth 3"),
    ("model to SVG, every op", "introspect"),
    ("model to SVG, every op", "torchview full depth"),
    ("model to SVG, every op", "torchlens"),
    ("capture every layer's output", "forward hooks"),
    ("capture every layer's output", "torchlens (every op)"),
    ("diff HF vs scratch", "introspect"),
    ("diff HF vs scratch", "forward hooks (by module name)"),
    ("peak memory: plain forward", "HF"),
    ("peak memory: diff HF vs scratch", "introspect"),
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Run the quick harness once into a temporary folder; keep torch's thread count."""
    out = tmp_path_factory.mktemp("bench")
    threads = torch.get_num_threads()
    try:
        assert bench_cli.main(["--quick", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    with (out / "benchmarks.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return out, rows


def test_csv_has_every_field_and_grid_row(report):
    _, rows = report
    assert list(rows[0]) == [f.name for f in fields(Measurement)]
    grid = {(r["task"], r["tool"]) for r in rows
            if r["section"] == GRID and r["model"] == "bert-tiny"}
    assert GRID_TASKS <= grid
    assert {r["section"] for r in rows} == {GRID, STARTUP, GROWTH}


def test_rows_that_ran_carry_figures_and_the_rest_say_why(report):
    _, rows = report
    for row in rows:
        if row["status"] == OK:
            assert row["seconds"] or row["peak_rss_mib"], row
        else:
            assert row["note"], row
    forward = next(r for r in rows if r["section"] == GRID and r["task"] == "plain forward"
                   and r["tool"] == "HF")
    trace = next(r for r in rows if r["section"] == GRID and r["task"] == "trace + shapes"
                 and r["tool"] == "introspect")
    assert float(trace["ratio"]) == pytest.approx(
        float(trace["seconds"]) / float(forward["seconds"]), rel=1e-3)


def test_markdown_has_the_sections_and_the_side_by_side_table(report):
    out, _ = report
    text = (out / "benchmarks.md").read_text()
    for heading in ("# Benchmarks", "## Targets (BERT-base)", "## bert-tiny",
                    "## Ahead and behind", "## Start-up", "## Cost growth",
                    "## Skipped, failed and not measured", "## Reproduce"):
        assert heading in text
    assert "| task | tool | 2 x 9 |" in text
    assert "| trace + shapes | torch.export + ShapeProp |" in text
    assert "`introspect --help`" in text
    assert "-core" in text and "torch 2." in text


def test_growth_plot_is_a_png(report):
    pytest.importorskip("matplotlib")
    out, _ = report
    assert (out / "benchmarks_growth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_reads_back_for_resume(report):
    from benchmarks.report import read_csv, render_csv

    out, _ = report
    text = (out / "benchmarks.csv").read_text()
    assert render_csv(read_csv(out / "benchmarks.csv")) == text
    assert not (out / "benchmarks.partial.csv").exists()
