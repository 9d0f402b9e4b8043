"""Named dimensions read from the records, and shapes named by layout, not by value."""

from __future__ import annotations

from introspect.render.dims import Dims, infer_dims


def test_infer_dims_of_bert_tiny(tiny_graph):
    dims = infer_dims(tiny_graph.records)
    assert dims.sizes == {
        "B": 2,
        "S": 8,
        "H": 128,
        "nh": 2,
        "hd": 64,
        "I": 512,
        "V": 30522,
        "P": 512,
        "L": 2,
    }
    assert dims.legend().startswith("B=2 batch · S=8 tokens · H=128 hidden · nh=2 heads")


def test_shapes_are_named_by_layout_when_values_collide():
    dims = Dims({"B": 2, "S": 8, "H": 128, "nh": 2, "hd": 64, "I": 512, "L": 2})
    assert dims.name((2, 8, 2, 64)) == "[B, S, nh, hd]"
    assert dims.name((2, 2, 8, 64)) == "[B, nh, S, hd]"
    assert dims.name((2, 1, 8, 8)) == "[B, 1, S, S]"
    assert dims.name((2, 8, 512)) == "[B, S, I]"
    assert dims.name((2, 2)) == "[B, L]"


def test_unknown_shapes_get_no_names():
    dims = Dims({"B": 2, "S": 9, "H": 768})
    assert dims.name((3, 5)) == "" and dims.name(()) == "" and dims.name(None) == ""


def test_multiple_choice_batch_is_b_times_c():
    dims = Dims({"B": 1, "C": 2, "S": 8, "H": 128})
    assert dims.name((1, 2, 8)) == "[B, C, S]"
    assert dims.name((2, 8, 128)) == "[B·C, S, H]"
