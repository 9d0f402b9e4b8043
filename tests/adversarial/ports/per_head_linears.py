"""BERT whose attention holds one small Linear per head for each of query, key and value
(imports only torch and ``adv_bert``; probe round r): each holds a block of the
reference's rows, weight and bias.

Under ``--backward`` no parameter gradient of those 36 weights was compared (the gradient
table read 67 of 103), and a fault that scales one head's query-weight gradient by 1.01,
its forward unchanged, PASSED.

- ``correct``: BERT's arithmetic, head by head;
- ``faulty_gradient``: layer 3, head 1's query weight read as ``W + 0.01 (W - W.detach())``;
- ``faulty_scale``: layer 3, head 1's scores scaled by 1.001 (its failing forward's hints
  said every query, key and value weight and bias of layer 3 was "left unloaded").
"""

from __future__ import annotations

import math
from typing import Any

import adv_bert
import torch
import torch.nn.functional as F
from torch import nn


class PerHeadBlock(adv_bert.Block):
    scaled_head: int | None = None
    hot_head: int | None = None

    def __init__(self, index: int, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__(index, hidden, heads, ffn, eps)
        d = hidden // heads
        self.hq, self.hk, self.hv = (nn.ModuleList(nn.Linear(hidden, d) for _ in range(heads))
                                     for _ in range(3))

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        outs = []
        for h in range(self.heads):
            w = self.hq[h].weight
            if h == self.scaled_head:  # the same values, a gradient 1.01 times
                w = w + 0.01 * (w - w.detach())
            q = F.linear(x, w, self.hq[h].bias)
            k, v = self.hk[h](x), self.hv[h](x)
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, S, S)
            if h == self.hot_head:
                scores = scores * 1.001
            scores = scores.masked_fill(~mask[:, 0], torch.finfo(scores.dtype).min)
            outs.append(scores.softmax(-1) @ v)
        return torch.cat(outs, dim=-1)


def correct(reference: Any) -> adv_bert.Bert:
    model = adv_bert.Bert(reference.config, PerHeadBlock)
    for block in model.blocks:
        del block.q, block.k, block.v
    weights = reference.model.state_dict()
    d = reference.config.hidden_size // reference.config.num_attention_heads
    state = {}
    for key in model.state_dict():
        parts = key.split(".")  # blocks.1.hq.4.weight, or one adv_bert names
        if len(parts) == 5 and parts[2] in HEADS:
            _, index, kind, head, leaf = parts
            whole = weights[f"encoder.layer.{index}.{HEADS[kind]}.{leaf}"]
            state[key] = whole[int(head) * d:(int(head) + 1) * d].clone()
        else:
            state[key] = weights[adv_bert.hf_key(key)].clone()
    model.load_state_dict(state)
    return model.eval()


HEADS = {"hq": "attention.self.query", "hk": "attention.self.key",
         "hv": "attention.self.value"}


def faulty_gradient(reference: Any) -> adv_bert.Bert:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].scaled_head = 1
    return model


def faulty_scale(reference: Any) -> adv_bert.Bert:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].hot_head = 1
    return model
