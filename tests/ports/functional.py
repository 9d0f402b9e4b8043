"""A BERT port written as functions over a dict of tensors, everything by hand.

Written for the tests on purpose, independently of ``introspect`` (it imports only torch).
What makes it unlike HF's BERT:

- weights in one flat dict (``ParameterDict``) under the port's own names, every Linear
  applied as ``x @ W.T + b`` (the bias added on its own);
- LayerNorm by hand: ``(x - mu) / sqrt(var + eps) * g + b``;
- softmax by hand: max-subtracted ``exp`` over its sum;
- the embeddings summed in another order: ``word + position + token_type``, with the
  position lookup shaped (S, H);
- heads kept as (B, S, nh, hd) throughout, attention with ``einsum``;
- GELU written with ``erf``.

``build(reference, fault=None, layer=0)`` returns the port (an ``nn.Module`` wrapping the
functions) in eval mode with one fault of ``FAULTS`` injected into encoder layer
``layer`` (or the embeddings / pooler).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = (
    "qk_swapped", "kv_swapped", "position_offset", "token_type_ignored", "token_type_twice",
    "mask_missing", "mask_on_query_axis", "mask_fill", "softmax_wrong_dim", "scale_1_over_d",
    "missing_residual", "pre_ln", "ln_unbiased_var", "ln_eps", "gelu_tanh", "pooler_no_tanh",
    "pooler_mean", "layers_out_of_order", "dropout_active", "weight_transposed",
    "weight_unloaded", "weight_from_other_layer",
)
# Slips a few times float32's rounding, which a fault test on random init cannot see:
# ``gelu_typed_constant``, the GELU's 1/sqrt(2) typed 0.70711.
SLIPS = ("gelu_typed_constant",)

Weights = Any  # a mapping name -> tensor (an nn.ParameterDict inside the module)


def layer_norm(x, g, b, eps, unbiased=False):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).sum(dim=-1, keepdim=True) / (x.shape[-1] - 1 if unbiased else x.shape[-1])
    return (x - mu) / torch.sqrt(var + eps) * g + b


def softmax(x, dim=-1):
    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def gelu(x, tanh=False, typed=False):
    if tanh:
        return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))
    if typed:  # 1/sqrt(2) typed to five places
        return 0.5 * x * (1 + torch.erf(x * 0.70711))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))


def linear(x, w, b):
    return x @ w.T + b


def embed(w: Weights, input_ids, token_type_ids, opts):
    S = input_ids.shape[1]
    pos = torch.arange(S, device=input_ids.device)  # (S,)
    if opts["position_offset"]:
        pos = pos + opts["position_offset"]
    x = F.embedding(input_ids, w["word"]) + F.embedding(pos, w["position"])  # (B,S,H) + (S,H)
    for _ in range(opts["token_type_uses"]):
        x = x + F.embedding(token_type_ids, w["token_type"])
    return layer_norm(x, w["emb_ln_g"], w["emb_ln_b"], opts["eps"])


def attention(w: Weights, i: int, x, keep, opts, fault: str | None):
    B, S, H = x.shape
    nh = opts["heads"]
    hd = H // nh
    q = linear(x, w[f"l{i}_wq"], w[f"l{i}_bq"]).reshape(B, S, nh, hd)  # (B, S, nh, hd)
    k = linear(x, w[f"l{i}_wk"], w[f"l{i}_bk"]).reshape(B, S, nh, hd)
    v = linear(x, w[f"l{i}_wv"], w[f"l{i}_bv"]).reshape(B, S, nh, hd)
    scale = 1.0 / hd if fault == "scale_1_over_d" else 1.0 / math.sqrt(hd)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # (B, nh, S, S)
    if fault != "mask_missing":
        if fault == "mask_on_query_axis":
            allowed = keep[:, None, :, None]  # (B, 1, S, 1)
        else:
            allowed = keep[:, None, None, :]  # (B, 1, 1, S)
        fill = -1.0 if fault == "mask_fill" else torch.finfo(scores.dtype).min
        scores = torch.where(allowed, scores, torch.full_like(scores, fill))
    probs = softmax(scores, dim=-2 if fault == "softmax_wrong_dim" else -1)
    if fault == "dropout_active":
        probs = F.dropout(probs, p=0.1, training=True)
    ctx = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, S, H)  # (B, S, H)
    return linear(ctx, w[f"l{i}_wo"], w[f"l{i}_bo"])


def encoder_layer(w: Weights, i: int, x, keep, opts, fault: str | None):
    eps = opts["eps"]
    ln1 = dict(eps=1e-3 if fault == "ln_eps" else eps, unbiased=fault == "ln_unbiased_var")
    if fault == "pre_ln":
        x = x + attention(w, i, layer_norm(x, w[f"l{i}_ln1_g"], w[f"l{i}_ln1_b"], eps), keep,
                          opts, fault)
        h = layer_norm(x, w[f"l{i}_ln2_g"], w[f"l{i}_ln2_b"], eps)
        return x + linear(gelu(linear(h, w[f"l{i}_w1"], w[f"l{i}_b1"])), w[f"l{i}_w2"],
                          w[f"l{i}_b2"])
    a = attention(w, i, x, keep, opts, fault)
    x = layer_norm(a if fault == "missing_residual" else x + a,
                   w[f"l{i}_ln1_g"], w[f"l{i}_ln1_b"], **ln1)
    h = gelu(linear(x, w[f"l{i}_w1"], w[f"l{i}_b1"]), tanh=fault == "gelu_tanh",
             typed=fault == "gelu_typed_constant")
    return layer_norm(x + linear(h, w[f"l{i}_w2"], w[f"l{i}_b2"]),
                      w[f"l{i}_ln2_g"], w[f"l{i}_ln2_b"], eps)


def pool(w: Weights, x, keep, fault: str | None):
    if fault == "pooler_mean":
        m = keep.unsqueeze(-1).to(x.dtype)
        first = (x * m).sum(dim=1) / m.sum(dim=1)
    else:
        first = x[:, 0]
    y = linear(first, w["pool_w"], w["pool_b"])
    return y if fault == "pooler_no_tanh" else torch.tanh(y)


def bert(w: Weights, input_ids, token_type_ids, attention_mask, opts, faults):
    """``faults``: {layer index or "embeddings"/"pooler": fault name}."""
    x = embed(w, input_ids, token_type_ids, opts)
    keep = attention_mask.bool()  # (B, S)
    for i in opts["order"]:
        x = encoder_layer(w, i, x, keep, opts, faults.get(i))
    return x, pool(w, x, keep, faults.get("pooler"))


class FunctionalBert(nn.Module):
    """Holds the weights dict; ``forward`` calls ``bert``. Returns (hidden, pooled)."""

    def __init__(self, weights: dict[str, torch.Tensor], opts: dict, faults: dict) -> None:
        super().__init__()
        self.w = nn.ParameterDict({k: nn.Parameter(v.clone()) for k, v in weights.items()})
        self.opts, self.faults = opts, faults

    def forward(self, input_ids, token_type_ids, attention_mask):
        return bert(self.w, input_ids, token_type_ids, attention_mask, self.opts, self.faults)


NAMES = {  # port name (per layer: with "l{i}_") -> HF name (per layer: under encoder.layer.{i}.)
    "word": "embeddings.word_embeddings.weight",
    "position": "embeddings.position_embeddings.weight",
    "token_type": "embeddings.token_type_embeddings.weight",
    "emb_ln_g": "embeddings.LayerNorm.weight", "emb_ln_b": "embeddings.LayerNorm.bias",
    "pool_w": "pooler.dense.weight", "pool_b": "pooler.dense.bias",
}
LAYER_NAMES = {
    "wq": "attention.self.query.weight", "bq": "attention.self.query.bias",
    "wk": "attention.self.key.weight", "bk": "attention.self.key.bias",
    "wv": "attention.self.value.weight", "bv": "attention.self.value.bias",
    "wo": "attention.output.dense.weight", "bo": "attention.output.dense.bias",
    "ln1_g": "attention.output.LayerNorm.weight", "ln1_b": "attention.output.LayerNorm.bias",
    "w1": "intermediate.dense.weight", "b1": "intermediate.dense.bias",
    "w2": "output.dense.weight", "b2": "output.dense.bias",
    "ln2_g": "output.LayerNorm.weight", "ln2_b": "output.LayerNorm.bias",
}


def load_weights(hf_state: dict[str, torch.Tensor], n_layers: int,
                 fault: str | None = None, layer: int = 0) -> dict[str, torch.Tensor]:
    """The port's weights dict from an HF BertModel state dict (shapes checked)."""
    names = dict(NAMES)
    for i in range(n_layers):
        names.update({f"l{i}_{k}": f"encoder.layer.{i}.{v}" for k, v in LAYER_NAMES.items()})
    swaps = {"qk_swapped": ("q", "k"), "kv_swapped": ("k", "v")}
    if fault in swaps:
        a, b = swaps[fault]
        for p in ("w", "b"):
            names[f"l{layer}_{p}{a}"], names[f"l{layer}_{p}{b}"] = (
                names[f"l{layer}_{p}{b}"], names[f"l{layer}_{p}{a}"])
    elif fault == "weight_from_other_layer":
        names[f"l{layer}_w2"] = f"encoder.layer.{(layer + 1) % n_layers}.output.dense.weight"
    weights = {}
    for mine, theirs in names.items():
        weights[mine] = hf_state[theirs].detach().clone()
    if fault == "weight_transposed":
        weights[f"l{layer}_wo"] = weights[f"l{layer}_wo"].T.contiguous()
    elif fault == "weight_unloaded":
        g = torch.Generator().manual_seed(7)
        weights[f"l{layer}_w1"] = torch.randn(weights[f"l{layer}_w1"].shape, generator=g) * 0.02
    for mine, theirs in names.items():
        if weights[mine].shape != hf_state[theirs].shape:
            raise ValueError(f"{mine}: {tuple(weights[mine].shape)} vs {theirs}: "
                             f"{tuple(hf_state[theirs].shape)}")
    return weights


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> FunctionalBert:
    """The port holding ``reference``'s weights, with ``fault`` injected (None: correct)."""
    if fault is not None and fault not in FAULTS + SLIPS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS + SLIPS)}")
    bert_model = getattr(reference, "bert", reference)
    c = bert_model.config
    opts: dict[str, Any] = {"heads": c.num_attention_heads, "eps": c.layer_norm_eps,
                            "order": list(range(c.num_hidden_layers)),
                            "position_offset": 0, "token_type_uses": 1}
    faults: dict[Any, str] = {}
    if fault == "position_offset":
        opts["position_offset"] = 1
    elif fault == "token_type_ignored":
        opts["token_type_uses"] = 0
    elif fault == "token_type_twice":
        opts["token_type_uses"] = 2
    elif fault in ("pooler_no_tanh", "pooler_mean"):
        faults["pooler"] = fault
    elif fault == "layers_out_of_order":
        order = opts["order"]
        order[layer], order[layer + 1] = order[layer + 1], order[layer]
    elif fault is not None:
        faults[layer] = fault  # the loader's faults are inert here
    weights = load_weights(bert_model.state_dict(), c.num_hidden_layers, fault, layer)
    return FunctionalBert(weights, opts, faults).eval()
