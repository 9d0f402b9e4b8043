"""Overlays: colours and notes per node, from mappings, DataFrames and errors."""

from __future__ import annotations

import pandas as pd
import pytest

from introspect.errors import InputError
from introspect.render import ERROR_SCALE, Overlay, draw_graph

QUERY_0 = "bert_encoder_layer_0_attention_self_query"
QUERY_1 = "bert_encoder_layer_1_attention_self_query"


def test_worst_prefers_scores_then_severity_then_order():
    overlay = Overlay(
        colors={"a": ERROR_SCALE[3], "b": ERROR_SCALE[0], "c": ERROR_SCALE[3]},
        scores={"a": 1.0, "b": 5.0},
    )
    assert overlay.worst(["a", "b", "c"]) == "b"  # highest score
    plain = Overlay(colors={"a": ERROR_SCALE[1], "b": ERROR_SCALE[3], "c": ERROR_SCALE[3]})
    assert plain.worst(["a", "b", "c"]) == "b"  # latest in severity, first in order
    assert plain.worst(["x", "y"]) is None
    custom = Overlay(colors={"a": ERROR_SCALE[3], "b": "#123456"})
    assert custom.worst(["a", "b"]) == "b"  # a colour outside the scale counts as worse


def test_from_errors_colours_by_budget():
    overlay = Overlay.from_errors(
        {"a": 0.0, "b": 5e-5, "c": 1e-3, "d": 1.0, "e": float("nan")}, budget=1e-5
    )
    assert [overlay.colors[k] for k in "abcde"] == [
        ERROR_SCALE[0],
        ERROR_SCALE[1],
        ERROR_SCALE[2],
        ERROR_SCALE[3],
        ERROR_SCALE[3],
    ]
    assert overlay.notes["b"] == "max err 5e-05" and overlay.worst("abcde") == "e"


def test_from_frame_skips_empty_cells():
    frame = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "color": ["red", None, "#00ff00"],
            "note": ["bad", "fine", float("nan")],
        }
    )
    overlay = Overlay.from_frame(frame)
    assert dict(overlay.colors) == {"a": "red", "c": "#00ff00"}
    assert dict(overlay.notes) == {"a": "bad", "b": "fine"}
    with pytest.raises(InputError, match="overlay table has no column 'name'"):
        Overlay.from_frame(pd.DataFrame({"node": ["a"]}))


def test_bad_colour_is_refused():
    with pytest.raises(InputError, match=r"overlay colour 'not a colour' of node 'a'"):
        Overlay(colors={"a": "not a colour"})


def test_overlay_paints_node_and_note(tiny_graph):
    source = draw_graph(
        tiny_graph,
        fold=False,
        overlay=Overlay(colors={"classifier": "#f59c9c"}, notes={"classifier": "max err 3e-6"}),
    ).source
    line = next(line for line in source.splitlines() if line.strip().startswith("classifier "))
    assert 'fillcolor="#f59c9c"' in line and "max err 3e-6" in line


def test_folded_block_shows_the_worst_colour(tiny_graph):
    overlay = Overlay.from_errors({QUERY_0: 0.0, QUERY_1: 0.5}, budget=1e-5)
    folded = draw_graph(tiny_graph, depth=1, overlay=overlay).source
    block = next(line for line in folded.splitlines() if "×2" in line)
    assert f'fillcolor="{ERROR_SCALE[3]}"' in block and f"({QUERY_1})" in block
    opened = draw_graph(tiny_graph, overlay=overlay).source  # the cluster's border, and note
    assert f'color="{ERROR_SCALE[3]}"' in opened and "worst: max err 0.5" in opened


def test_overlay_accepts_mapping_and_frame(tiny_graph):
    by_mapping = draw_graph(tiny_graph, overlay={"classifier": "red"}).source
    by_frame = draw_graph(
        tiny_graph, overlay=pd.DataFrame({"name": ["classifier"], "color": ["red"]})
    ).source
    assert by_mapping == by_frame and "fillcolor=red" in by_mapping


def test_overlay_with_unknown_names_is_refused(tiny_graph):
    with pytest.raises(InputError, match=r"overlay names 1 node\(s\) this graph does not have"):
        draw_graph(tiny_graph, overlay={"no_such_node": "red"})
    with pytest.raises(InputError, match="overlay must be an Overlay"):
        draw_graph(tiny_graph, overlay=42)


def test_outlined_layer_is_thick_red_and_folded_ones_thinner(tiny_graph):
    overlay = Overlay.from_errors({QUERY_0: 0.0, QUERY_1: 0.5}, budget=1e-5)
    outlined = Overlay(overlay.colors, overlay.notes, overlay.scores, outline=("encoder.layer.1",))
    source = draw_graph(tiny_graph, depth=2, expand=[1], overlay=outlined).source
    lines = source.splitlines()
    cluster = lines[next(i for i, line in enumerate(lines)
                         if 'subgraph "cluster_encoder/encoder.layer.1"' in line) + 1]
    assert 'color="#cf222e"' in cluster and "penwidth=5" in cluster
    assert 'id="outline_encoder.layer.1"' in cluster
    others = [line for line in lines if "penwidth=" in line and "outline_" not in line
              and "cluster" not in line and line.lstrip().startswith(("color=", "fontsize"))]
    assert all("penwidth=5" not in line and "penwidth=4" not in line for line in others)
    boxed = draw_graph(tiny_graph, depth=1, fold=False, overlay=outlined).source
    box = next(line for line in boxed.splitlines()
               if line.strip().startswith('"box/encoder.layer.1" '))
    assert 'color="#cf222e"' in box and 'id="outline_encoder.layer.1"' in box
    assert "outline_" not in draw_graph(tiny_graph, depth=2, overlay=overlay).source


def test_a_passing_folded_block_has_a_thin_border(trace_tiny, tiny_graph):
    overlay = Overlay.from_errors({QUERY_0: 0.0, QUERY_1: 0.0}, budget=1e-5)
    source = draw_graph(tiny_graph, overlay=overlay).source
    block = next(line for line in source.splitlines() if "×2" in line and "color=" in line)
    assert f'color="{ERROR_SCALE[0]}"' in block and "penwidth=2" in block


def _cluster_boxes(svg: bytes) -> dict[str, tuple[float, float, float, float]]:
    """(left, top, right, bottom) of each cluster of a Graphviz SVG, by its name."""
    import re
    from xml.etree import ElementTree

    ns = "{http://www.w3.org/2000/svg}"
    boxes = {}
    for group in ElementTree.fromstring(svg).iter(f"{ns}g"):
        if group.get("class") != "cluster":
            continue
        name = group.findtext(f"{ns}title") or ""
        shape = group.find(f"{ns}path")
        points = shape.get("d") if shape is not None else group.find(f"{ns}polygon").get("points")
        numbers = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", points or "")]
        xs, ys = numbers[0::2], numbers[1::2]
        boxes[name] = (min(xs), min(ys), max(xs), max(ys))
    return boxes


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="no Graphviz")
def test_layer_blocks_stack_vertically_not_as_a_staircase(tiny_graph):
    """Layer 1 holds a mask reference: its block once sat beside layer 0's, not below it."""
    from introspect.render import render_bytes

    svg = render_bytes(draw_graph(tiny_graph, depth=2, fold=False), "svg")
    boxes = _cluster_boxes(svg)
    first = boxes["cluster_encoder/encoder.layer.0"]
    second = boxes["cluster_encoder/encoder.layer.1"]
    assert second[1] >= first[3]  # below it, not beside it
    assert min(first[2], second[2]) - max(first[0], second[0]) > 0  # in one column


def test_max_width_bounds_the_picture(tiny_graph):
    # In a notebook the graph's own drawing fits the cell unless told otherwise.
    assert 'size="9.4,1000"' in tiny_graph.draw(expand=[0]).source
    assert " size=" not in tiny_graph.draw(max_width=None).source
    assert 'size="9.4,1000"' in draw_graph(tiny_graph, max_width=9.4).source
    assert " size=" not in draw_graph(tiny_graph).source
    with pytest.raises(InputError, match="max_width must be a positive number"):
        draw_graph(tiny_graph, max_width=0)
