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
