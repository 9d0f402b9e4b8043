"""Alignment: weights anchor, structure fills in, every leftover node has a reason."""

from __future__ import annotations

import pytest
import torch

import introspect
import introspect.scratch as scratch
from introspect.diff.api import record_for_diff
from introspect.diff.ops.align import align_graphs
from introspect.diff.records import BY_CONSUMER, BY_INPUT, BY_OUTPUT, BY_STRUCTURE, BY_WEIGHTS
from introspect.errors import InputError
from tests.fixtures.candidates import PerHeadBert, fuse_qkv

KNOWN_WAYS = {BY_INPUT, BY_OUTPUT, BY_WEIGHTS, BY_STRUCTURE, BY_CONSUMER}


def _align(reference, candidate, inputs, **options):
    ref, _, _ = record_for_diff(reference, inputs.tensors, "reference")
    cand, _, _ = record_for_diff(candidate, inputs.tensors, "candidate")
    return ref, cand, align_graphs(ref, cand, **options)


def test_every_reference_tensor_node_is_paired_or_explained(tiny_diff):
    alignment = tiny_diff.alignment
    reference = tiny_diff.reference
    paired = {p.reference for p in alignment.pairs}
    explained = {u.node for u in [*alignment.unmatched, *alignment.skipped]
                 if u.graph == "reference"}
    tensors = {r.name for r in reference.records if r.kind == "tensor"}
    assert tensors <= paired | explained
    assert all(u.reason for u in alignment.unmatched)
    assert {p.matched_by for p in alignment.pairs} <= KNOWN_WAYS
    assert alignment.coverage > 0.7


def test_hf_and_scratch_pair_the_same_modules(tiny_diff):
    for row in tiny_diff.rows:
        if row.matched_by == BY_WEIGHTS and row.op != "getitem":  # same modules in both
            assert row.reference_node == row.candidate_node
    unmatched = {u.node for u in tiny_diff.alignment.unmatched if u.graph == "reference"}
    assert "scaled_dot_product_attention" not in unmatched


def test_fused_qkv_aligns_on_slices_of_the_fused_output(tiny, port, inputs):
    _, _, alignment = _align(tiny, fuse_qkv(port), inputs)
    pairs = alignment.pairs_of("reference", "encoder_layer_0_attention_self_key")
    regions = {(p.candidate, p.candidate_region and (p.candidate_region.start,
                                                       p.candidate_region.stop)) for p in pairs}
    assert ("encoder_layer_0_attention_self_qkv", (128, 256)) in regions
    assert any(p.candidate.startswith("getitem") and p.candidate_region is None for p in pairs)


def test_per_head_modules_align_on_row_slices_without_a_name_map(tiny, inputs):
    _, _, alignment = _align(tiny, PerHeadBert.from_hf(tiny), inputs)
    query = alignment.pairs_of("reference", "encoder_layer_1_attention_self_query")
    assert sorted((p.candidate, p.reference_region.start, p.reference_region.stop)
                  for p in query) == [("layers_1_attention_heads_0_q", 0, 64),
                                      ("layers_1_attention_heads_1_q", 64, 128)]
    cat = [p for p in alignment.pairs if p.candidate == "cat_1"]
    assert cat and cat[0].reference.startswith("contiguous")  # the joined heads


def test_eager_candidate_pairs_sdpa_with_the_last_matmul(tiny, inputs):
    eager = scratch.BertModel.from_hf(tiny, attn_implementation="eager")
    _, _, alignment = _align(tiny, eager, inputs)
    [pair] = alignment.pairs_of("reference", "scaled_dot_product_attention")
    assert pair.candidate == "matmul_1"
    softmax = next(u for u in alignment.unmatched if u.node == "softmax")
    assert "inside the candidate" not in softmax.reason
    assert "scaled_dot_product_attention" in softmax.reason


def test_transposed_weights_relate(tiny, port, inputs):
    class TransposedLinear(torch.nn.Module):  # x @ W with W stored (in, out)
        def __init__(self, linear):
            super().__init__()
            self.w = torch.nn.Parameter(linear.weight.detach().t().contiguous())
            self.b = torch.nn.Parameter(linear.bias.detach().clone())

        def forward(self, x):
            return x @ self.w + self.b

    candidate = scratch.BertModel.from_hf(tiny)
    candidate.pooler.dense = TransposedLinear(candidate.pooler.dense)
    _, _, alignment = _align(tiny, candidate, inputs)
    kinds = {r.kind for r in alignment.relations if r.candidate == "pooler.dense.w"}
    assert kinds == {"transposed"}
    assert alignment.pairs_of("reference", "pooler_dense")[0].candidate == "add_6"
    result = introspect.diff(tiny, candidate, inputs)
    assert result.passed


def test_name_map_pairs_nodes_outright(tiny, port, inputs):
    _, _, alignment = _align(tiny, port, inputs, name_map={"add_2": "add_6"})
    assert alignment.pairs_of("candidate", "add_2")[0].reference == "add_6"
    with pytest.raises(InputError, match="no node of the reference"):
        _align(tiny, port, inputs, name_map={"add_2": "nope"})


def test_different_sizes_are_refused(tiny, inputs):
    config = scratch.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=256)
    with pytest.raises(InputError, match=r"shares weights with only \d+ of \d+ weighted nodes "
                                         r"\(.* vs .* weights\): another model or size"):
        introspect.diff(tiny, scratch.BertModel(config), inputs)


def test_different_outputs_are_refused(tiny_models, tiny, inputs):
    classifier = tiny_models("token-classification", "sdpa").model
    with pytest.raises(InputError, match="return different outputs"):
        introspect.diff(tiny, classifier, inputs)


@pytest.mark.parametrize("make, message", [
    (lambda ids: {"input_ids": ids, "attention_mask": torch.ones(2, 9, dtype=torch.long)},
     "could not run"),
    (lambda ids: {"input_ids": ids.float()}, "could not run"),
    (lambda ids: {}, "diff needs inputs"),
])
def test_inputs_the_models_cannot_take_are_refused(tiny, port, make, message):
    from introspect.errors import IntrospectError

    ids = torch.randint(1000, 2000, (2, 8))
    with pytest.raises(IntrospectError, match=message):
        introspect.diff(tiny, port, make(ids))
