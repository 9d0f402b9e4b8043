"""In a notebook: result.nodes and result.layers highlight failing rows yet stay DataFrames
users can filter; result.draw() is the drawing coloured by error."""

from __future__ import annotations

import pandas as pd
import pytest

from introspect.render import ERROR_SCALE
from introspect.report.notebook import DiffTable


def test_tables_are_dataframes_that_stay_highlighted_when_filtered(failing_diff):
    nodes, layers = failing_diff.nodes, failing_diff.layers
    assert isinstance(nodes, pd.DataFrame) and isinstance(layers, DiffTable)
    failing = nodes[nodes.status == "fail"]
    assert isinstance(failing, DiffTable) and len(failing) >= 1
    assert isinstance(nodes["status"], pd.Series)
    pd.testing.assert_frame_equal(pd.DataFrame(layers), pd.DataFrame(
        failing_diff.layers.to_dict("records")), check_frame_type=True)


def test_failing_rows_are_highlighted_in_html(failing_diff):
    page = failing_diff.layers._repr_html_()
    row = list(failing_diff.layers["passed"]).index(False)
    styled_rule = page.split("{")[0]  # the cells of the first style rule
    assert f"_row{row}_col0" in styled_rule and "background-color: #f8d7da" in page
    assert failing_diff.layers._repr_html_() == page  # deterministic HTML


def test_long_tables_show_the_first_rows_and_say_how_many_more(failing_diff):
    with pd.option_context("display.max_rows", 10):
        page = failing_diff.nodes._repr_html_()
    assert f"… and {len(failing_diff.nodes) - 10} more rows" in page


def test_draw_gives_the_error_coloured_drawing(failing_diff):
    graphviz = pytest.importorskip("graphviz")
    drawing = failing_diff.draw(depth=2)
    assert isinstance(drawing, graphviz.Digraph) and hasattr(drawing, "_repr_mimebundle_")
    source = drawing.source
    assert ERROR_SCALE[0] in source  # nodes within budget: green
    assert "fillcolor=\"#ffc98a\"" in source  # the tanh GELU: orange, up to 1000x its budget
    assert "box/encoder.layer.1.intermediate" in source  # the failing layer is drawn open


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="no Graphviz")
def test_draw_fits_a_notebook_cell_and_stacks_the_layers(failing_diff):
    """result.draw(depth=2) once drew the layers as a staircase cut at the cell's edge."""
    import re

    from introspect.render import render_bytes
    from tests.render.test_overlay import _cluster_boxes

    svg = render_bytes(failing_diff.draw(depth=2), "svg")
    width = float(re.search(rb'<svg width="([\d.]+)pt"', svg).group(1))
    assert width <= 9.4 * 72 + 1  # about 900 px: a Jupyter output cell
    boxes = _cluster_boxes(svg)
    first, second = boxes["cluster_encoder/encoder.layer.0"], boxes[
        "cluster_encoder/encoder.layer.1"]
    assert second[1] >= first[3] and min(first[2], second[2]) > max(first[0], second[0])
    assert 'id="outline_encoder.layer.1"' in svg.decode()  # the failing one, in red
