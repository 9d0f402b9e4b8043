"""A BERT encoder written the way a GPT port is (imports only torch): one fused q/k/v
projection split by ``chunk``, attention through ``einsum``, a hand-written LayerNorm, the
mask turned into an additive bias by the layer and handed to its attention, an FFN with
a GELU of its own. The faults sit inside one module of layer 1 (the smallest module that
holds them is the one named):

- ``faulty_tanh``: the FFN's GELU is the tanh approximation (``Gelu``);
- ``faulty_scale``: the attention scores are scaled by 1.02 / sqrt(head size)
  (``Attention``);
- ``faulty_eps``: the second LayerNorm's eps is 1e-3 (``Norm``);
- ``faulty_bias_arg``: the layer hands its attention a bias of -1e4 at padding, not the
  dtype's minimum; with padding, a padded key still gets weight exp(-1e4) = 0 in float32,
  so this port is correct in effect: it must PASS (``correct`` is the plain twin).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class Norm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(width))
        self.beta = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.gamma + self.beta


class Gelu(nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate=self.approximate)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, stretch: float = 1.0) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.stretch = stretch

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, w // self.heads) for t in (q, k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (self.stretch / math.sqrt(w // self.heads))
        weights = (scores + bias).softmax(dim=-1)
        return self.out(torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, w))


class Layer(nn.Module):
    def __init__(self, width: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(width, heads)
        self.norm1 = Norm(width, eps)
        self.up = nn.Linear(width, inner)
        self.gelu = Gelu()
        self.down = nn.Linear(inner, width)
        self.norm2 = Norm(width, eps)
        self.fill: float | None = None  # the bias at padding (None: the dtype's minimum)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        fill = torch.finfo(x.dtype).min if self.fill is None else self.fill
        bias = (~keep)[:, None, None, :].to(x.dtype) * fill  # (B, 1, 1, S)
        x = self.norm1(x + self.attention(x, bias))
        return self.norm2(x + self.down(self.gelu(self.up(x))))


class Encoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        c = config
        self.words = nn.Embedding(c.vocab_size, c.hidden_size)
        self.places = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.kinds = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.norm = Norm(c.hidden_size, c.layer_norm_eps)
        self.layers = nn.ModuleList(
            Layer(c.hidden_size, c.num_attention_heads, c.intermediate_size, c.layer_norm_eps)
            for _ in range(c.num_hidden_layers))

    def forward(self, input_ids, token_type_ids, attention_mask):
        s = input_ids.shape[1]
        x = self.norm(self.words(input_ids) + self.kinds(token_type_ids)
                      + self.places(torch.arange(s, device=input_ids.device)))
        keep = attention_mask.bool()
        for layer in self.layers:
            x = layer(x, keep)
        return {"last_hidden_state": x}


def _load(model: Encoder, reference: Any) -> Encoder:
    theirs = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
    mine = {"words.weight": theirs["embeddings.word_embeddings.weight"],
            "places.weight": theirs["embeddings.position_embeddings.weight"],
            "kinds.weight": theirs["embeddings.token_type_embeddings.weight"],
            "norm.gamma": theirs["embeddings.LayerNorm.weight"],
            "norm.beta": theirs["embeddings.LayerNorm.bias"]}
    for i in range(len(model.layers)):
        hf = f"encoder.layer.{i}."
        for leaf in ("weight", "bias"):
            mine[f"layers.{i}.attention.qkv.{leaf}"] = torch.cat(
                [theirs[f"{hf}attention.self.{n}.{leaf}"] for n in ("query", "key", "value")])
            mine[f"layers.{i}.attention.out.{leaf}"] = theirs[f"{hf}attention.output.dense.{leaf}"]
            mine[f"layers.{i}.up.{leaf}"] = theirs[f"{hf}intermediate.dense.{leaf}"]
            mine[f"layers.{i}.down.{leaf}"] = theirs[f"{hf}output.dense.{leaf}"]
        for norm, hf_norm in (("norm1", "attention.output.LayerNorm"),
                              ("norm2", "output.LayerNorm")):
            mine[f"layers.{i}.{norm}.gamma"] = theirs[f"{hf}{hf_norm}.weight"]
            mine[f"layers.{i}.{norm}.beta"] = theirs[f"{hf}{hf_norm}.bias"]
    model.load_state_dict(mine)
    return model.eval()


def _built(reference: Any) -> Encoder:
    return _load(Encoder(reference.config), reference)


def correct(reference):
    return _built(reference)


def faulty_tanh(reference):
    model = _built(reference)
    model.layers[1].gelu.approximate = "tanh"
    return model


def faulty_scale(reference):
    model = _built(reference)
    model.layers[1].attention.stretch = 1.02
    return model


def faulty_eps(reference):
    model = _built(reference)
    model.layers[1].norm2.eps = 1e-3
    return model


def correct_bias_fill(reference):
    model = _built(reference)
    model.layers[1].fill = -1e4
    return model
