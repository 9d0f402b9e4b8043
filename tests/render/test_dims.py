"""Named dimensions read from the records, and shapes named by layout, not by value."""

from __future__ import annotations

import pytest

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


# Each family's tiny config (tests/fixtures/families.py): hidden 32, 4 heads of 8,
# ELECTRA and ALBERT embedding in 16, Llama with 2 key/value heads.
FAMILY_DIMS = {
    "roberta": {"H": 32, "nh": 4, "hd": 8, "I": 64, "P": 514},
    "distilbert": {"H": 32, "nh": 4, "hd": 8, "I": 64, "P": 512},
    "electra": {"E": 16, "H": 32, "nh": 4, "hd": 8, "I": 64, "P": 512},
    "albert": {"E": 16, "H": 32, "nh": 4, "hd": 8, "I": 64, "P": 512},
    "gpt2": {"H": 32, "nh": 4, "hd": 8, "I": 128, "3H": 96, "P": 1024},
    "llama": {"H": 32, "nh": 4, "nkv": 2, "hd": 8, "I": 64},
}
# A shape each family computes, and how it must read.
FAMILY_NAMES = {
    "electra": [((2, 8, 16), "[B, S, E]"), ((2, 8, 32), "[B, S, H]")],
    "albert": [((2, 8, 16), "[B, S, E]"), ((2, 8, 64), "[B, S, I]")],
    "gpt2": [((2, 8, 96), "[B, S, 3H]"), ((16, 32), "[B·S, H]"), ((32, 96), "[H, 3H]")],
    "llama": [((2, 2, 8, 8), "[B, nkv, S, hd]"), ((2, 4, 8, 8), "[B, nh, S, hd]")],
}


@pytest.mark.parametrize("family", sorted(FAMILY_DIMS))
def test_each_family_gets_its_own_sizes_and_names(family):
    import introspect
    from tests.fixtures.families import tiny_inputs, tiny_model

    graph = introspect.trace(tiny_model(family), tiny_inputs(family), cache=False)
    dims = infer_dims(graph.records)
    assert dims.sizes == {"B": 2, "S": 8, **FAMILY_DIMS[family], "V": 30522}
    shapes = {r.shape for r in graph.records if r.shape}
    for shape, name in FAMILY_NAMES.get(family, []):
        assert shape in shapes and dims.name(shape) == name
    if family != "llama":  # Llama's rotary halves and GQA repeats have no symbol: unnamed
        assert all(dims.name(r.shape) for r in graph.records if r.kind == "tensor" and r.shape)
