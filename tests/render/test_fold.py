"""Folding identical encoder layers, expanding chosen ones, and layout-op chains."""

from __future__ import annotations

import dataclasses

import pytest

from introspect.errors import InputError
from introspect.render.fold import (
    LayerGroup,
    layer_groups,
    layer_members,
    layout_chains,
    resolve_expand,
)
from introspect.tracing.records import KIND_OTHER, KIND_SHAPE


def drawn(graph):
    return [r for r in graph.records if r.kind not in (KIND_SHAPE, KIND_OTHER)]


def copy_layer(layer, index):
    """bert-tiny's layer 0 renamed as layer ``index``: structurally identical."""

    def rename(text):
        return text.replace("layer.0", f"layer.{index}").replace("layer_0", f"layer_{index}")

    return [
        dataclasses.replace(
            r,
            name=rename(r.name),
            module=rename(r.module),
            layer=rename(r.layer),
            inputs=tuple(map(rename, r.inputs)),
        )
        for r in layer
    ]


def spans(groups):
    return [(g.first, g.last, g.count) for g in groups]


def test_identical_layers_fold(tiny_graph):
    groups = layer_groups(layer_members(drawn(tiny_graph)))
    assert spans(groups) == [(0, 1, 2)]
    assert groups[0].label == "encoder.layer.0–1 ×2" and groups[0].key == "encoder.layer.0-1"


def test_no_fold_and_expand(tiny_graph):
    members = layer_members(drawn(tiny_graph))
    assert spans(layer_groups(members, fold=False)) == [(0, 0, 1), (1, 1, 1)]
    assert spans(layer_groups(members, expand=[-1])) == [(0, 0, 1), (1, 1, 1)]


def test_expand_first_and_last_of_twelve(tiny_graph):
    layer = layer_members(drawn(tiny_graph))[0]
    twelve = {i: copy_layer(layer, i) for i in range(12)}
    assert spans(layer_groups(twelve)) == [(0, 11, 12)]
    assert spans(layer_groups(twelve, expand=[0, 11])) == [(0, 0, 1), (1, 10, 10), (11, 11, 1)]
    assert spans(layer_groups(twelve, expand=[5])) == [(0, 4, 5), (5, 5, 1), (6, 11, 6)]


def test_a_different_layer_breaks_the_fold(tiny_graph):
    layer = layer_members(drawn(tiny_graph))[0]
    odd = [dataclasses.replace(r, shape=(9, 9)) if r.op_type == "Linear" else r for r in layer]
    layers = {0: layer, 1: copy_layer(layer, 1), 2: copy_layer(odd, 2), 3: copy_layer(layer, 3)}
    assert spans(layer_groups(layers)) == [(0, 1, 2), (2, 2, 1), (3, 3, 1)]


def test_resolve_expand():
    assert resolve_expand([0, -1], 12) == {0, 11}
    with pytest.raises(InputError, match=r"cannot expand layer 12: the model has 12"):
        resolve_expand([12], 12)
    with pytest.raises(InputError, match="cannot expand layer -13"):
        resolve_expand([-13], 12)


def test_group_names():
    assert LayerGroup(3, 3, 1).label == "encoder.layer.3"
    assert LayerGroup(1, 10, 10).label == "encoder.layer.1–10 ×10"


def test_layout_chains_of_attention(tiny_graph):
    chains = layout_chains(drawn(tiny_graph))
    ops = sorted(tuple(m.op_type for m in chain) for chain in chains.values())
    # per layer: three head splits (view, transpose) and one merge
    assert ops.count(("view", "transpose")) == 6
    assert ops.count(("reshape", "transpose", "contiguous", "reshape", "contiguous")) == 2
