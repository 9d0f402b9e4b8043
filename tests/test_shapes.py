"""Every node gets a record; BERT-base shows the tutorial's shapes on a 2 x 9 batch."""

from __future__ import annotations

import pytest

from introspect.graph import trace
from introspect.tracing.records import KIND_MULTI, KIND_OTHER, KIND_SHAPE, KIND_TENSOR
from tests.conftest import make_batch


@pytest.fixture(scope="module")
def base_graph():
    from introspect.models.load import load_model

    loaded = load_model("bert-base", head="sequence-classification", attn="eager")
    return trace(loaded.model, make_batch(2, 9, padded=True))


def test_bert_base_shapes_match_the_tutorial(base_graph):
    records = base_graph.records
    by_module = {r.module: r for r in records if r.op == "call_module"}
    assert by_module["bert.embeddings.LayerNorm"].shape == (2, 9, 768)
    assert by_module["bert.encoder.layer.0.intermediate.dense"].shape == (2, 9, 3072)
    assert by_module["bert.pooler.dense"].shape == (2, 768)
    assert by_module["classifier"].shape == (2, 2)
    layer0 = [r for r in records if r.layer == "encoder.layer.0"]
    split_heads = [r.shape for r in layer0 if r.op_type == "transpose"]
    assert split_heads[:3] == [(2, 12, 9, 64)] * 3  # query, key, value after the head split
    scores = [r.shape for r in layer0 if r.op_type == "matmul"]
    assert scores[0] == (2, 12, 9, 9)  # attention scores
    softmax = next(r for r in layer0 if r.op_type == "softmax")
    assert softmax.shape == (2, 12, 9, 9)


def test_every_tensor_node_has_a_shape_and_bookkeeping_is_marked(base_graph):
    kinds = {r.kind for r in base_graph.records}
    assert {KIND_TENSOR, KIND_SHAPE} <= kinds
    for r in base_graph.records:
        if r.kind == KIND_TENSOR:
            assert r.shape is not None and r.dtype and r.numel > 0 and r.nbytes > 0, r
        if r.kind == KIND_SHAPE:
            assert r.value and r.shape is None, r
        assert r.kind != KIND_OTHER or r.op in ("call_function", "call_method"), r
    assert sum(r.kind == KIND_SHAPE for r in base_graph.records) > 50


def test_flops_and_params_of_a_linear(base_graph):
    query = base_graph.record("bert_encoder_layer_0_attention_self_query")
    assert query.params == 768 * 768 + 768
    assert query.flops == 2 * (2 * 9 * 768) * 768
    assert query.layer == "encoder.layer.0"
    assert query.module == "bert.encoder.layer.0.attention.self.query"


def test_layers_table_sums_the_records(base_graph):
    layers = base_graph.layers
    assert list(layers["layer"][:3]) == ["inputs", "embeddings", "mask"]
    assert [f"encoder.layer.{i}" for i in range(12)] == [
        name for name in layers["layer"] if name.startswith("encoder.")]
    assert list(layers["layer"][-3:]) == ["pooler", "head", "outputs"]
    layer3 = layers.set_index("layer").loc["encoder.layer.3"]
    assert layer3["output_shape"] == "(2, 9, 768)"
    assert layer3["params"] == 4 * (768 * 768 + 768) + 2 * 2 * 768 + 2 * 768 * 3072 + 3072 + 768
    assert layers["nodes"].sum() == len(base_graph.records)


def test_tuple_outputs_are_recorded(tiny_models):
    loaded = tiny_models("question-answering")
    graph = trace(loaded.model, make_batch(2, 9, padded=True))
    split = [r for r in graph.records if r.kind == KIND_MULTI]
    assert split and "(2, 9, 1)" in split[0].shapes  # qa_outputs split into start/end
    assert graph.output_names == ("start_logits", "end_logits")


def test_networkx_edges_carry_shapes(tiny_models):
    graph = trace(tiny_models("base").model, make_batch(2, 9, padded=True))
    digraph = graph.to_networkx()
    assert digraph.number_of_nodes() == len(graph.records)
    edge = digraph.edges["bert_embeddings_layer_norm" if False else "embeddings_layer_norm",
                         "embeddings_dropout"]
    assert edge["shape"] == "(2, 9, 128)"
    assert digraph.nodes["embeddings_layer_norm"]["layer"] == "embeddings"
