"""Attention probabilities from the traced graph equal HF's eager ``output_attentions``.

Computed from an sdpa model (where HF returns no probabilities at all), for every layer
and head, on bert-tiny and the real MiniLM, padded and unpadded.
"""

from __future__ import annotations

import math

import pytest
import torch

import introspect
from introspect.attention import AttentionMaps
from introspect.attention.maps import attention
from introspect.errors import InputError, TraceError
from tests.bounds import below, close, rounding_bound

from .conftest import PADDED_TEXTS, SHORT_TEXT


def eager_attentions(model, tensors) -> torch.Tensor:
    with torch.no_grad():
        out = model(**tensors, output_attentions=True)
    return torch.stack(out.attentions)  # (L, B, nh, S, S)


@pytest.mark.parametrize("texts", [(SHORT_TEXT,), PADDED_TEXTS], ids=["unpadded", "padded"])
@pytest.mark.parametrize("source", ["bert-tiny", "minilm"])
def test_sdpa_maps_equal_hf_eager_output_attentions(source, texts, tiny_models, minilm):
    from introspect.models.load import load_model

    sdpa = tiny_models("base", "sdpa") if source == "bert-tiny" else minilm
    eager = tiny_models("base", "eager") if source == "bert-tiny" else \
        load_model("minilm", attn="eager")
    assert sdpa.model.config._attn_implementation == "sdpa"
    inputs = introspect.tokenize(sdpa.tokenizer, list(texts))
    maps = introspect.attention(sdpa.model, inputs)
    expected = eager_attentions(eager.model, inputs.tensors)
    config = sdpa.model.config
    assert maps.probs.shape == (config.num_hidden_layers, len(texts),
                                config.num_attention_heads, *expected.shape[-2:])
    for layer in range(maps.num_layers):
        for head in range(maps.num_heads):
            assert close(maps.probs[layer, :, head], expected[layer, :, head],
                         rtol=1.3e-6, atol=1e-5, what=source), (layer, head)
    if len(texts) > 1:
        assert not maps.keep.all()  # the batch really is padded


def test_eager_model_gives_its_own_softmax_exactly(tiny_models):
    loaded = tiny_models("base", "eager")
    inputs = introspect.tokenize(loaded.tokenizer, list(PADDED_TEXTS))
    maps = attention(loaded.model, inputs)
    assert torch.equal(maps.probs, eager_attentions(loaded.model, inputs.tensors))


def test_scratch_bert_maps_equal_hf(tiny_models):
    hf = tiny_models("base", "eager")
    inputs = introspect.tokenize(hf.tokenizer, list(PADDED_TEXTS))
    expected = eager_attentions(hf.model, inputs.tensors)
    for attn in ("sdpa", "eager"):
        port = introspect.scratch.BertModel.from_hf(hf.model, attn_implementation=attn)
        maps = introspect.attention(port, inputs)
        assert close(maps.probs, expected, rtol=1.3e-6, atol=1e-5, what=attn), attn


def test_padding_keys_weigh_nothing_and_rows_sum_to_one(tiny_models):
    loaded = tiny_models("base", "sdpa")
    maps = introspect.attention(loaded.model, introspect.tokenize(loaded.tokenizer,
                                                                   list(PADDED_TEXTS)))
    padded = ~maps.keep  # (B, S)
    assert padded.any()
    for b in range(maps.batch_size):
        if padded[b].any():
            assert maps.probs[:, b][..., padded[b]].abs().max() == 0.0
    assert close(maps.probs.sum(-1), torch.ones(()), rtol=0, atol=1e-5, what="rows sum to 1")
    frame = maps.frame()
    assert list(frame.columns) == ["layer", "head", "batch", "query", "query_token", "key",
                                   "key_token", "weight"]
    assert "[PAD]" not in set(frame["query_token"]) | set(frame["key_token"])
    lengths = [maps.length(b) for b in range(maps.batch_size)]
    assert len(frame) == maps.num_layers * maps.num_heads * sum(n * n for n in lengths)
    assert len(maps.frame(padding=True)) == maps.probs.numel()
    first = frame.iloc[0]
    assert (first["query_token"], first["weight"]) == ("[CLS]", pytest.approx(
        float(maps.probs[0, 0, 0, 0, 0])))


def test_tensor_inputs_and_graph_module(tiny_models):
    from introspect.tracing.tracer import trace_module

    loaded = tiny_models("base", "sdpa")
    tensors = dict(introspect.tokenize(loaded.tokenizer, [SHORT_TEXT]).tensors)
    maps = introspect.attention(loaded.model, tensors)
    assert maps.tokens[0][0] == "101"  # ids as text without a tokenizer
    gm = trace_module(loaded.model, tensors).gm
    again = introspect.attention(gm, tensors)
    assert torch.equal(maps.probs, again.probs)
    assert maps.modules == ("encoder.layer.0.attention.self", "encoder.layer.1.attention.self")


def test_lazy_api_names():
    assert introspect.AttentionMaps is AttentionMaps
    assert callable(introspect.attention)
    assert introspect.attention.compare_heads.__name__ == "compare_heads"


def test_bad_inputs_raise_input_error(tiny_models, tiny_short_maps):
    loaded = tiny_models("base", "sdpa")
    with pytest.raises(InputError, match="non-empty mapping"):
        introspect.attention(loaded.model, {})
    with pytest.raises(InputError, match="must be tensors"):
        introspect.attention(loaded.model, {"input_ids": [1, 2]})
    with pytest.raises(InputError, match="head 7 is out of range: this model has 2 heads"):
        tiny_short_maps.head(0, 7)
    with pytest.raises(InputError, match="layer -1 is out of range"):
        tiny_short_maps.head(-1, 0)


def test_a_model_without_attention_is_refused():
    class NoAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x)

    with pytest.raises(TraceError, match="found no attention"):
        introspect.attention(NoAttention(), {"x": torch.ones(2, 4)})


@pytest.mark.numeric
def test_stats_on_known_maps():
    """A head that looks at the previous token, one that looks at [CLS], one uniform."""
    S = 4
    previous = torch.zeros(S, S)
    previous[0, 0] = 1.0
    for i in range(1, S):
        previous[i, i - 1] = 1.0
    to_cls = torch.zeros(S, S)
    to_cls[:, 0] = 1.0
    uniform = torch.full((S, S), 1 / S)
    probs = torch.stack([previous, to_cls, uniform])[None, None]  # (1, 1, 3, S, S)
    maps = AttentionMaps(probs, (("[CLS]", "a", "b", "[SEP]"),),
                         torch.ones(1, S, dtype=torch.bool))
    stats = maps.stats().set_index("head")
    assert stats.loc[0, "to_prev"] == 1.0 and stats.loc[0, "to_next"] == 0.0
    assert stats.loc[0, "entropy"] == 0.0 and stats.loc[0, "max_weight"] == 1.0
    assert stats.loc[1, "to_cls"] == 1.0 and stats.loc[1, "to_self"] == 0.25
    # a sum of S terms p log p in float32 (tests/bounds.py): 3.3e-6; 1e-6 had a 2.7x margin
    entropy_bound = rounding_bound("float32", S, math.log(S))
    assert below(abs(stats.loc[2, "entropy"] - math.log(S)), entropy_bound, "entropy of 1/4s")
    assert stats.loc[2, "to_sep"] == 0.25
    assert list(maps.stats().columns) == ["layer", "head", "entropy", "to_cls", "to_sep",
                                          "to_self", "to_prev", "to_next", "max_weight"]


def test_a_model_in_training_mode_is_read_in_eval_and_left_training():
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    torch.manual_seed(0)
    model = transformers.BertModel(config)
    tensors = {"input_ids": torch.tensor([[101, 2051, 10029, 102]]),
               "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    model.train()
    first = introspect.attention(model, tensors)
    assert model.training
    second = introspect.attention(model.eval(), tensors)
    assert torch.equal(first.probs, second.probs)  # no dropout in either
