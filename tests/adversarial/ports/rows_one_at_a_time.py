"""Ports that run the batch's rows one at a time (imports only torch).

Written in another hand from ``adv_bert``: attention by ``bmm``, its own names.

- ``seq_first``: each row encoded alone, sequence-first, (S, 1, H) throughout, the mask
  added before the softmax; the rows joined at the end;
- ``real_tokens``: each row cut to its real tokens (no mask at all), batch-first
  (1, L, H); its padded positions filled with zeros at the end.

Faults, in layer ``fault_layer`` only: ``eps`` (the attention LayerNorm's eps 1e-5 for
1e-12: it moves bert-tiny's outputs by 6e-6, under their budget) and ``tanh`` (the tanh
GELU).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, config: Any, eps: float, approximate: str) -> None:
        super().__init__()
        width = config.hidden_size
        self.heads = config.num_attention_heads
        self.query, self.key, self.value, self.mix = (nn.Linear(width, width) for _ in range(4))
        self.first_norm = nn.LayerNorm(width, eps=eps)
        self.widen = nn.Linear(width, config.intermediate_size)
        self.narrow = nn.Linear(config.intermediate_size, width)
        self.second_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.approximate = approximate

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        S, B, W = x.shape  # sequence-first
        size = W // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(S, B * self.heads, size).transpose(0, 1)  # (B*nh, S, hd)

        scores = torch.bmm(heads(self.query(x)), heads(self.key(x)).transpose(1, 2))
        scores = scores / math.sqrt(size)
        if bias is not None:
            scores = scores + bias
        mixed = torch.bmm(scores.softmax(-1), heads(self.value(x)))
        x = self.first_norm(x + self.mix(mixed.transpose(0, 1).reshape(S, B, W)))
        inner = F.gelu(self.widen(x), approximate=self.approximate)
        return self.second_norm(x + self.narrow(inner))


class RowByRow(nn.Module):
    def __init__(self, config: Any, trim: bool, fault: str, layer: int) -> None:
        super().__init__()
        width = config.hidden_size
        self.words = nn.Embedding(config.vocab_size, width)
        self.places = nn.Embedding(config.max_position_embeddings, width)
        self.segments = nn.Embedding(config.type_vocab_size, width)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(
            Layer(config, 1e-5 if fault == "eps" and i == layer else config.layer_norm_eps,
                  "tanh" if fault == "tanh" and i == layer else "none")
            for i in range(config.num_hidden_layers))
        self.pool = nn.Linear(width, width)
        self.trim = trim

    def encode(self, ids: torch.Tensor, segments: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """One row: (S,) ids -> (S, H)."""
        if self.trim:
            real = int(mask.sum())
            ids, segments, bias = ids[:real], segments[:real], None
        else:
            bias = (1.0 - mask.float()) * torch.finfo(torch.float32).min  # (S,)
        places = torch.arange(ids.shape[0])
        x = self.norm(self.words(ids) + self.places(places) + self.segments(segments))
        x = x[:, None, :]  # (S, 1, H): sequence-first, a batch of one
        for layer in self.layers:
            x = layer(x, bias)
        return x[:, 0, :]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = []
        for ids, mask, segments in zip(input_ids, attention_mask, token_type_ids, strict=True):
            row = self.encode(ids, segments, mask)
            pad = input_ids.shape[1] - row.shape[0]
            rows.append(F.pad(row, (0, 0, 0, pad)) if pad else row)
        hidden = torch.stack(rows)  # (B, S, H)
        return {"last_hidden_state": hidden, "pooler_output": torch.tanh(self.pool(hidden[:, 0]))}


PARTS = {"query": "attention.self.query", "key": "attention.self.key",
         "value": "attention.self.value", "mix": "attention.output.dense",
         "first_norm": "attention.output.LayerNorm", "widen": "intermediate.dense",
         "narrow": "output.dense", "second_norm": "output.LayerNorm"}
TOP = {"words": "embeddings.word_embeddings", "places": "embeddings.position_embeddings",
       "segments": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm",
       "pool": "pooler.dense"}


def _built(reference: Any, trim: bool, fault: str = "") -> RowByRow:
    config = reference.config
    layer = 1 if config.num_hidden_layers <= 2 else 3
    model = RowByRow(config, trim, fault, layer)
    theirs = reference.model.state_dict()
    state = {}
    for key in model.state_dict():
        module, _, leaf = key.rpartition(".")
        if module in TOP:
            state[key] = theirs[f"{TOP[module]}.{leaf}"].clone()
        else:
            _, index, part = module.split(".")
            state[key] = theirs[f"encoder.layer.{index}.{PARTS[part]}.{leaf}"].clone()
    model.load_state_dict(state)
    return model.eval()


def seq_first(reference: Any) -> RowByRow:
    return _built(reference, trim=False)


def seq_first_eps(reference: Any) -> RowByRow:
    return _built(reference, trim=False, fault="eps")


def seq_first_tanh(reference: Any) -> RowByRow:
    return _built(reference, trim=False, fault="tanh")


def real_tokens(reference: Any) -> RowByRow:
    return _built(reference, trim=True)


def real_tokens_eps(reference: Any) -> RowByRow:
    return _built(reference, trim=True, fault="eps")
