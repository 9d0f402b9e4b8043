"""Verdicts to trust (issue 10, issue 12 item 5): confirmed divergences, local errors that
stay local, shared weights aligned call by call, non-finite values, and what the inputs
never exercised."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers

import introspect
from introspect.diff.records import BY_WEIGHTS, STATUS_FAIL
from introspect.models.load import tokenize
from tests.ports import functional, hf_like, nanogpt_style
from tests.ports.batch import port_batch


@pytest.fixture(scope="module")
def two_segments(tiny_models):
    return port_batch(tiny_models("base", "sdpa").tokenizer)


def test_albert_against_itself_aligns_call_by_call(inputs):
    torch.manual_seed(0)
    config = transformers.AlbertConfig(vocab_size=30522, embedding_size=32, hidden_size=64,
                                       num_hidden_layers=3, num_attention_heads=2,
                                       intermediate_size=128)
    albert = transformers.AlbertModel(config).eval()
    result = introspect.diff(albert, copy.deepcopy(albert), inputs)
    assert result.passed and result.max_abs_err == 0.0
    for pair in result.alignment.pairs:  # call k of the shared layer pairs with call k
        assert pair.reference == pair.candidate
    shared = [r for r in result.rows if "albert_layers" in r.module]
    assert {r.layer for r in shared} == {"encoder.layer.0", "encoder.layer.1", "encoder.layer.2"}
    assert len({r.layer for r in result.rows if r.op == "Linear" and "query" in r.module}) == 3


def test_tied_masked_lm_against_itself_passes(tiny_models, inputs):
    model = tiny_models("masked-lm", "sdpa").model
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    result = introspect.diff(model, copy.deepcopy(model), inputs)
    assert result.passed and result.max_abs_err == 0.0
    layers = {r.layer for r in result.rows if "encoder.layer" in r.module}
    assert layers == {"encoder.layer.0", "encoder.layer.1"}


def test_a_nan_weight_fails_against_itself_and_is_named(tiny, inputs):
    broken = copy.deepcopy(tiny)
    with torch.no_grad():
        broken.encoder.layer[1].intermediate.dense.weight[0, 0] = math.nan
    result = introspect.diff(broken, copy.deepcopy(broken), inputs)
    assert not result.passed
    d = result.first_divergence
    assert d.reference_node == "encoder_layer_1_intermediate_dense"
    assert "NaN or Inf first appear here" in d.detail
    assert any("NaN or Inf" in n for n in result.notes)
    allowed = introspect.diff(broken, copy.deepcopy(broken), inputs, allow_nonfinite=True)
    assert allowed.passed
    assert any("allowed by allow_nonfinite" in n for n in allowed.notes)


@pytest.mark.parametrize("style", [hf_like, nanogpt_style, functional],
                         ids=["hf_like", "nanogpt_style", "functional"])
def test_correct_ports_have_no_failing_node(tiny, two_segments, style):
    result = introspect.diff(tiny, style.build(tiny), two_segments)
    assert result.passed, result.summary()
    assert not result.failing and result.counts()["unconfirmed"] == 0


def test_regrouped_embedding_sums_are_never_paired(minilm):
    """HF adds word + token_type, then position; the functional port word + position first."""
    result = introspect.diff(minilm.model, functional.build(minilm.model),
                             port_batch(minilm.tokenizer))
    assert result.passed and not result.failing, result.summary()
    first_sums = {p.reference: p.candidate for p in result.alignment.pairs
                  if p.reference == "add_1"}  # HF's word + token_type
    cand = {n.name: n for n in result.candidate.gm.graph.nodes}
    for c in first_sums.values():
        read = {str(getattr(i, "target", "")) for i in cand[c].all_input_nodes}
        assert not any("pos" in t for t in read), f"word + token_type paired with {c}"


def test_a_fault_in_one_layer_fails_only_that_layer(minilm):
    """The local error stays local: later layers may drift, never FAIL."""
    port = nanogpt_style.build(minilm.model, "kv_swapped", layer=2)
    result = introspect.diff(minilm.model, port, port_batch(minilm.tokenizer))
    assert not result.passed
    assert {r.layer for r in result.rows if r.status == STATUS_FAIL} == {"encoder.layer.2"}
    assert result.first_divergence.layer == "encoder.layer.2"
    fused = [r for r in result.alignment.relations if r.candidate.endswith("c_attn.bias")]
    assert {r.kind for r in fused} == {"fused"} and len(fused) >= 3  # q, k, v biases


def test_a_pooler_without_tanh_is_blamed_on_the_pooler(tiny, two_segments):
    result = introspect.diff(tiny, hf_like.build(tiny, "pooler_no_tanh"), two_segments)
    d = result.first_divergence
    assert d.layer == "pooler" and d.op == "Tanh"


def test_a_layout_op_is_never_blamed(tiny, two_segments):
    result = introspect.diff(tiny, nanogpt_style.build(tiny, "kv_swapped", layer=1),
                             two_segments)
    d = result.first_divergence
    assert d.layer == "encoder.layer.1"
    assert d.op not in ("view", "transpose", "contiguous", "reshape", "getitem", "Dropout")


def test_notes_say_what_the_inputs_never_exercised(tiny, inputs):
    port = hf_like.build(tiny, "token_type_ignored")
    port.train()
    result = introspect.diff(tiny, port, inputs)
    assert port.training  # the mode is put back
    notes = " ".join(result.notes)
    assert "every token_type_id is 0" in notes
    assert "no recorded op of the candidate reads the values of token_type_ids" in notes
    assert "candidate was in training mode; diff ran it in eval mode" in notes
    padded = tokenize(introspect.load_model("bert-tiny").tokenizer, ("one text",))
    unpadded = introspect.diff(tiny, copy.deepcopy(tiny), padded, nodes=True).notes
    assert "no padding in the batch" in " ".join(unpadded)


def test_a_graphs_note_named_by_its_side_reads_as_one_phrase():
    """(probe round k found "the reference's the attention mask is always built ...")"""
    from types import SimpleNamespace

    from introspect.diff.ops.explain import side_notes
    from introspect.graph import MASK_NOTE

    notes = side_notes(SimpleNamespace(notes=[MASK_NOTE]), SimpleNamespace(notes=["x"]))
    assert notes[0].startswith("the reference's attention mask is always built in the graph")
    assert notes[1] == "the candidate's x"


def test_bfloat16_under_noise_budget_gets_no_noise_budget_hint(tiny, inputs):
    faulty = copy.deepcopy(tiny).to(torch.bfloat16)
    with torch.no_grad():
        faulty.encoder.layer[1].intermediate.dense.bias += 1.0
    result = introspect.diff(tiny, faulty, inputs, noise_budget=True)
    assert not result.passed
    assert not any("noise_budget=True" in h for h in result.first_divergence.hints)


def test_weighted_pairs_of_a_fused_bias_port_keep_their_regions(tiny, two_segments):
    result = introspect.diff(tiny, nanogpt_style.build(tiny), two_segments)
    query = [p for p in result.alignment.pairs if p.matched_by == BY_WEIGHTS
             and p.reference == "encoder_layer_0_attention_self_query"]
    assert query and all(p.candidate_region is None or p.candidate_region.stop <= 128
                         for p in query)
