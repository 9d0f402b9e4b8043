"""docs/columns.md lists every column of the DataFrames a diff returns, with its meaning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from introspect.diff.backward.parity import GradientDiff, ParameterGradient
from introspect.diff.generation.records import StepDiff
from introspect.diff.records import LayerDiff, NodeDiff

PAGE = Path(__file__).resolve().parents[2] / "docs" / "columns.md"


def documented(section: str) -> set[str]:
    text = PAGE.read_text().split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+) \|", text, flags=re.M)
    return {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}


@pytest.mark.parametrize("section, record, extra", [
    ("DiffResult.nodes", NodeDiff, set()),
    ("DiffResult.layers", LayerDiff, {"status"}),
    ("DiffResult.parameters", ParameterGradient, set()),
    ("DiffResult.backward.nodes", GradientDiff, set()),
    ("DiffResult.steps", StepDiff, set()),
])
def test_every_column_is_documented(section, record, extra):
    assert documented(section) == set(record.__dataclass_fields__) | extra


def test_the_terminal_uses_the_dataframe_names():
    from introspect.cli import backward_view, diff_view

    source = Path(diff_view.__file__).read_text() + Path(backward_view.__file__).read_text()
    headers = set(re.findall(r'Column\("(\w+)"', source))
    known = set(NodeDiff.__dataclass_fields__) | set(LayerDiff.__dataclass_fields__) \
        | set(ParameterGradient.__dataclass_fields__)
    assert headers <= known, headers - known
