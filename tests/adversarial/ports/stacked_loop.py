"""BERT with every layer's weights stacked in ``(L, ...)`` parameters and one Python loop
indexing them, as JAX-style ports are (imports only torch; probe round s). It is laid
out as the reference is, ``(B, S, H)`` between layers, but no module holds a layer's
attention: the heads' note said it "takes its input in another layout".

- ``correct``: BERT's arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_PARTS = {"q": "attention.self.query", "k": "attention.self.key",
          "v": "attention.self.value", "o": "attention.output.dense",
          "ln1": "attention.output.LayerNorm", "up": "intermediate.dense",
          "down": "output.dense", "ln2": "output.LayerNorm"}


class StackedLoop(nn.Module):
    def __init__(self, reference: Any) -> None:
        super().__init__()
        c, weights = reference.config, reference.model.state_dict()
        self.layers, self.heads = c.num_hidden_layers, c.num_attention_heads
        self.eps = c.layer_norm_eps
        for short, long in _PARTS.items():
            for leaf in ("weight", "bias"):
                stacked = torch.stack([weights[f"encoder.layer.{i}.{long}.{leaf}"]
                                       for i in range(self.layers)])
                self.register_parameter(f"{short}_{leaf}", nn.Parameter(stacked.clone()))
        self.word = nn.Embedding.from_pretrained(
            weights["embeddings.word_embeddings.weight"].clone())
        self.pos = nn.Embedding.from_pretrained(
            weights["embeddings.position_embeddings.weight"].clone())
        self.seg = nn.Embedding.from_pretrained(
            weights["embeddings.token_type_embeddings.weight"].clone())
        self.norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.norm.load_state_dict({k: weights[f"embeddings.LayerNorm.{k}"].clone()
                                   for k in ("weight", "bias")})
        self.pool = nn.Linear(c.hidden_size, c.hidden_size)
        self.pool.load_state_dict({k: weights[f"pooler.dense.{k}"].clone()
                                   for k in ("weight", "bias")})

    def _linear(self, x: torch.Tensor, part: str, i: int) -> torch.Tensor:
        return F.linear(x, getattr(self, f"{part}_weight")[i], getattr(self, f"{part}_bias")[i])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        B, S = input_ids.shape
        x = self.norm(self.word(input_ids) + self.seg(token_type_ids)
                      + self.pos(torch.arange(S)))
        H = x.shape[-1]
        size = H // self.heads
        add = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for i in range(self.layers):
            q, k, v = (self._linear(x, part, i).view(B, S, self.heads, size).transpose(1, 2)
                       for part in ("q", "k", "v"))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + add, -1) @ v
            a = a.transpose(1, 2).reshape(B, S, H)
            x = F.layer_norm(self._linear(a, "o", i) + x, (H,), self.ln1_weight[i],
                             self.ln1_bias[i], self.eps)
            h = F.gelu(self._linear(x, "up", i))
            x = F.layer_norm(self._linear(h, "down", i) + x, (H,), self.ln2_weight[i],
                             self.ln2_bias[i], self.eps)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference: Any) -> StackedLoop:
    return StackedLoop(reference).eval()
