"""BERT whose encoder layer is written for one sequence and mapped over the batch's rows with
``torch.func.vmap`` (imports only torch).

Written the way a port from JAX reads: ``row(x, neg)`` takes one sequence (S, H), its
LayerNorms by hand (the mean, then the mean of squared deviations), and the layer's
``forward`` is ``vmap(self.row)``. The Linears are called under the map: the capture keeps
each as one call over the whole batch, the layer sees nothing finer than itself run on
the reference's inputs, and the LayerNorms between the Linears are no module at all.

The fault (in layer ``layer``): ``eps``, the attention LayerNorm with eps 1e-5 where the
config says 1e-12: within its layer's rounding at the layer's boundary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def layer_norm(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor,
               eps: float) -> torch.Tensor:
    centred = x - x.mean(-1, keepdim=True)
    variance = (centred * centred).mean(-1, keepdim=True)
    return centred / torch.sqrt(variance + eps) * gain + bias


class RowLayer(nn.Module):
    def __init__(self, config: Any, attention_eps: float) -> None:
        super().__init__()
        width = config.hidden_size
        self.heads, self.head_dim = config.num_attention_heads, width // config.num_attention_heads
        self.eps, self.attention_eps = config.layer_norm_eps, attention_eps
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, width)

    def row(self, x: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        S, H = x.shape
        q, k, v = (p(x).view(S, self.heads, self.head_dim).transpose(0, 1)
                   for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(1, 2) / math.sqrt(self.head_dim) + neg
        context = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(S, H)
        x = layer_norm(x + self.o(context), self.ln1.weight, self.ln1.bias, self.attention_eps)
        return layer_norm(x + self.fc2(F.gelu(self.fc1(x))), self.ln2.weight, self.ln2.bias,
                          self.eps)

    def forward(self, x: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        return torch.func.vmap(self.row)(x, neg)


class RowBert(nn.Module):
    def __init__(self, reference: Any, fault: str = "", layer: int = 1) -> None:
        super().__init__()
        config = reference.config
        width, self.eps = config.hidden_size, config.layer_norm_eps
        self.word = nn.Embedding(config.vocab_size, width)
        self.position = nn.Embedding(config.max_position_embeddings, width)
        self.segment = nn.Embedding(config.type_vocab_size, width)
        self.ln = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            RowLayer(config, 1e-5 if fault == "eps" and i == layer else self.eps)
            for i in range(config.num_hidden_layers))
        self.pool = nn.Linear(width, width)
        theirs = reference.state_dict()
        state = {"word.weight": "embeddings.word_embeddings.weight",
                 "position.weight": "embeddings.position_embeddings.weight",
                 "segment.weight": "embeddings.token_type_embeddings.weight",
                 "ln.weight": "embeddings.LayerNorm.weight", "ln.bias": "embeddings.LayerNorm.bias",
                 "pool.weight": "pooler.dense.weight", "pool.bias": "pooler.dense.bias"}
        parts = {"q": "attention.self.query", "k": "attention.self.key",
                 "v": "attention.self.value", "o": "attention.output.dense",
                 "ln1": "attention.output.LayerNorm", "fc1": "intermediate.dense",
                 "fc2": "output.dense", "ln2": "output.LayerNorm"}
        for i in range(config.num_hidden_layers):
            for mine, part in parts.items():
                for kind in ("weight", "bias"):
                    state[f"layers.{i}.{mine}.{kind}"] = f"encoder.layer.{i}.{part}.{kind}"
        self.load_state_dict({mine: theirs[name].detach().clone()
                              for mine, name in state.items()})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        S = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.segment(token_type_ids) + self.position.weight[:S]
        x = layer_norm(x, self.ln.weight, self.ln.bias, self.eps)
        neg = (1.0 - attention_mask.to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, neg)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def build(reference: Any, fault: str = "", layer: int = 1) -> RowBert:
    return RowBert(reference, fault, layer).eval()
