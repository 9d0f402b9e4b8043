"""What a drawing contains at each depth: blocks, clusters, the mask, the position branch."""

from __future__ import annotations

import pytest

from introspect.errors import InputError
from introspect.render.plan import MASK_ID, MODEL_ID, TOKENS_ID, build_plan
from introspect.tracing.records import KIND_OTHER, KIND_SHAPE


def titles(plan):
    return [n.title for n in plan.nodes]


def test_depth_0_is_one_box(tiny_graph):
    plan = build_plan(tiny_graph, depth=0)
    ids = [n.id for n in plan.nodes]
    assert ids == [
        TOKENS_ID,
        "input_ids",
        "token_type_ids",
        "attention_mask",
        MODEL_ID,
        "output/logits",
    ]
    assert not plan.clusters


def test_depth_1_shows_the_big_blocks(tiny_graph):
    plan = build_plan(tiny_graph, depth=1)
    assert titles(plan) == [
        "tokens",
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "embeddings",
        "attention mask",
        "encoder.layer.0–1 ×2",
        "pooler",
        "dropout",
        "classifier",
        "logits",
    ]
    block = next(n for n in plan.nodes if n.style == "block")
    assert block.shape == (2, 8, 128)
    assert any(m.startswith("bert_encoder_layer_1") for m in block.members)  # folded copy


def test_depth_3_opens_layers_and_attention(tiny_graph):
    plan = build_plan(tiny_graph, depth=3)
    labels = {spec.label for spec in plan.clusters.values()}
    assert {
        "embeddings",
        "encoder",
        "encoder.layer.0–1 ×2",
        "attention",
        "intermediate",
        "output",
        "pooler",
    } <= labels
    assert "attention.self" in titles(plan) and "attention.output" in titles(plan)


def test_default_opens_every_module_and_collapses_layout(tiny_graph):
    plan = build_plan(tiny_graph)
    assert titles(plan).count("split heads") == 3 and titles(plan).count("merge heads") == 1
    assert "scaled dot-product attention" in titles(plan)
    assert sum(n.id == MASK_ID for n in plan.nodes) == 1
    mask = next(n for n in plan.nodes if n.id == MASK_ID)
    assert mask.shape == (2, 1, 8, 8)


def test_position_branch_is_drawn(tiny_graph):
    plan = build_plan(tiny_graph)
    edges = {(e.source, e.target) for e in plan.edges}
    assert ("bert_embeddings_position_ids", "getitem_2") in edges
    assert ("getitem_2", "bert_embeddings_position_embeddings") in edges


def test_edges_carry_shapes(tiny_graph):
    plan = build_plan(tiny_graph, depth=1)
    labels = {(e.source, e.target): e.label for e in plan.edges}
    assert labels[("input_ids", "box/embeddings")] == "(2, 8)"
    assert labels[("classifier", "output/logits")] == "(2, 2)"


def test_full_draws_every_node_but_bookkeeping(tiny_graph):
    plan = build_plan(tiny_graph, depth="full")
    drawn = [
        r.name
        for r in tiny_graph.records
        if r.kind not in (KIND_SHAPE, KIND_OTHER) and r.op != "output"
    ]
    members = [m for n in plan.nodes for m in n.members if n.style != "output"]
    assert sorted(members) == sorted(drawn)
    assert all(len(n.members) == 1 for n in plan.nodes if n.style not in ("tokens", "maskref"))
    assert ("mask",) in plan.clusters and not any(n.style == "layout" for n in plan.nodes)


def test_expand_keeps_layers_open(tiny_graph):
    plan = build_plan(tiny_graph, depth=1, expand=[0, -1])
    assert "encoder.layer.0" in titles(plan) and "encoder.layer.1" in titles(plan)
    assert not any("×" in t for t in titles(plan))


@pytest.mark.parametrize("depth", [-1, 1.5, "deep", True])
def test_bad_depth(tiny_graph, depth):
    with pytest.raises(InputError, match="depth must be a whole number >= 0 or 'full'"):
        build_plan(tiny_graph, depth=depth)


def test_bad_expand(tiny_graph):
    with pytest.raises(InputError, match="cannot expand layer 2: the model has 2 encoder layers"):
        build_plan(tiny_graph, expand=[2])


@pytest.mark.parametrize(
    "head, outputs",
    [
        ("question-answering", ["start_logits", "end_logits"]),
        ("pretraining", ["prediction_logits", "seq_relationship_logits"]),
        ("base", ["last_hidden_state", "pooler_output"]),
    ],
)
def test_every_output_gets_its_node(trace_tiny, head, outputs):
    graph = trace_tiny(head)
    plan = build_plan(graph, depth=1)
    output_nodes = [n for n in plan.nodes if n.style == "output"]
    assert [n.title for n in output_nodes] == outputs
    targets = {e.target for e in plan.edges}
    assert all(n.id in targets for n in output_nodes)


def test_later_layers_refer_back_to_the_mask(tiny_graph):
    plan = build_plan(tiny_graph, fold=False)
    mask_targets = [e.target for e in plan.edges if e.source == MASK_ID]
    assert mask_targets == ["scaled_dot_product_attention"]  # layer 0 only
    references = [n for n in plan.nodes if n.style == "maskref"]
    assert len(references) == 1 and references[0].shape == (2, 1, 8, 8)
    assert references[0].cluster[:2] == ("encoder", "encoder.layer.1")
