"""BERT holding its attention heads in another order (imports only torch and
``adv_bert``; probe round s): each layer's blocks of query, key and value rows permuted
by head, the output projection's columns to match. Every head computes the reference's
attention, at another index.

The faulty twin's heads line said "first divergent head: layer 0, head 0 (0.458); 62
of 72 heads over budget": each head was compared with the reference's head at its own
index.

- ``correct``: BERT's arithmetic, heads permuted in every layer;
- ``faulty``: the same, layer 3's GELU (1's on bert-tiny) the tanh one.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


def _heads_permuted(model: adv_bert.Bert, reference: Any) -> adv_bert.Bert:
    heads = reference.config.num_attention_heads
    size = reference.config.hidden_size // heads
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for block in model.blocks:
            order = torch.randperm(heads, generator=generator)
            rows = (order[:, None] * size + torch.arange(size)[None, :]).reshape(-1)
            for linear in (block.q, block.k, block.v):
                linear.weight.copy_(linear.weight[rows].clone())
                linear.bias.copy_(linear.bias[rows].clone())
            block.proj.weight.copy_(block.proj.weight[:, rows].clone())
    return model.eval()


def correct(reference: Any) -> adv_bert.Bert:
    return _heads_permuted(adv_bert.build(reference), reference)


def faulty(reference: Any) -> adv_bert.Bert:
    return _heads_permuted(adv_bert.tanh_in_fault_layer(adv_bert.build(reference), reference),
                           reference)
