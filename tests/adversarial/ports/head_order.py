"""A BERT encoder whose attention runs each head in a Python loop, on its slice of the
projections, and concatenates the heads' outputs (imports only torch). Builds:

- ``correct``: the heads concatenated in their order;
- ``reversed_heads``: layer 3 concatenates them last to first;
- ``swapped_heads``: layer 3 swaps heads 0 and 5 (a wrong index table).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FAULT_LAYER = 3


class Layer(nn.Module):
    def __init__(self, sd: dict, prefix: str, config, order: list[int] | None) -> None:
        super().__init__()
        self.weights = nn.ParameterDict({
            key.replace(".", "_"): nn.Parameter(value.clone())
            for key, value in sd.items() if key.startswith(prefix)})
        self.prefix, self.eps = prefix, config.layer_norm_eps
        self.heads = config.num_attention_heads
        self.order = order or list(range(self.heads))

    def w(self, name: str) -> torch.Tensor:
        return self.weights[(self.prefix + name).replace(".", "_")]

    def forward(self, x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        H = x.shape[-1]
        d = H // self.heads
        q, k, v = (F.linear(x, self.w(f"attention.self.{n}.weight"),
                            self.w(f"attention.self.{n}.bias")).split(d, dim=-1)
                   for n in ("query", "key", "value"))
        outs = []
        for h in range(self.heads):
            scores = torch.einsum("bqd,bkd->bqk", q[h], k[h]) / math.sqrt(d)
            scores = scores.masked_fill(blocked, -1e30)
            outs.append(torch.einsum("bqk,bkd->bqd", scores.softmax(-1), v[h]))
        context = torch.cat([outs[i] for i in self.order], dim=-1)
        x = F.layer_norm(x + F.linear(context, self.w("attention.output.dense.weight"),
                                      self.w("attention.output.dense.bias")),
                         (H,), self.w("attention.output.LayerNorm.weight"),
                         self.w("attention.output.LayerNorm.bias"), self.eps)
        y = F.linear(F.gelu(F.linear(x, self.w("intermediate.dense.weight"),
                                     self.w("intermediate.dense.bias"))),
                     self.w("output.dense.weight"), self.w("output.dense.bias"))
        return F.layer_norm(x + y, (H,), self.w("output.LayerNorm.weight"),
                            self.w("output.LayerNorm.bias"), self.eps)


class Encoder(nn.Module):
    def __init__(self, reference, order: list[int] | None = None) -> None:
        super().__init__()
        sd, config = reference.model.state_dict(), reference.config
        self.tokens = nn.Parameter(sd["embeddings.word_embeddings.weight"].clone())
        self.positions = nn.Parameter(sd["embeddings.position_embeddings.weight"].clone())
        self.segments = nn.Parameter(sd["embeddings.token_type_embeddings.weight"].clone())
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.norm.load_state_dict({"weight": sd["embeddings.LayerNorm.weight"],
                                   "bias": sd["embeddings.LayerNorm.bias"]})
        self.layers = nn.ModuleList(
            Layer(sd, f"encoder.layer.{i}.", config, order if i == FAULT_LAYER else None)
            for i in range(config.num_hidden_layers))
        self.pool = nn.Linear(config.hidden_size, config.hidden_size)
        self.pool.load_state_dict({"weight": sd["pooler.dense.weight"],
                                   "bias": sd["pooler.dense.bias"]})

    def forward(self, input_ids, token_type_ids, attention_mask):
        S = input_ids.shape[1]
        x = self.norm(self.tokens[input_ids] + self.segments[token_type_ids]
                      + self.positions[:S])
        blocked = attention_mask[:, None, :] == 0  # (B, 1, S): keys that are padding
        for layer in self.layers:
            x = layer(x, blocked)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference):
    return Encoder(reference).eval()


def reversed_heads(reference):
    return Encoder(reference, list(range(reference.config.num_attention_heads))[::-1]).eval()


def swapped_heads(reference):
    order = list(range(reference.config.num_attention_heads))
    order[0], order[5] = 5, 0
    return Encoder(reference, order).eval()
