"""BERT whose FFN output Linear is split in two halves of its inputs, summed (imports only
torch and ``adv_bert``; probe round q). Tensor-parallel code writes a row-parallel
Linear this way: each half a shard, the sum their all-reduce.

The first half's Linear holds the reference's bias and half its weight's columns, and
takes the first half of the GELU's output. Its output, a few percent from the whole,
was paired with the reference's output.dense as its value and failed by 2.34: a correct
port FAILED in encoder.layer.1, and the weight was said to be "left unloaded".

- ``correct``: BERT's arithmetic, the output Linear in two halves;
- ``faulty``: the same, layer 3's output LayerNorm with eps 1e-5.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
from torch import nn


class SplitOutput(adv_bert.Block):
    def __init__(self, index: int, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__(index, hidden, heads, ffn, eps)
        del self.ffn_out
        self.half = ffn // 2
        self.out_a = nn.Linear(self.half, hidden)
        self.out_b = nn.Linear(ffn - self.half, hidden, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        h = self.activation(self.ffn_in(x))  # (B, S, ffn)
        y = self.out_a(h[..., :self.half]) + self.out_b(h[..., self.half:])
        return self.norm2(x + y)


def correct(reference: Any) -> adv_bert.Bert:
    model = adv_bert.Bert(reference.config, SplitOutput)
    weights = reference.model.state_dict()
    state = {}
    for key in model.state_dict():
        if ".out_" not in key:
            state[key] = weights[adv_bert.hf_key(key)].clone()
            continue
        _, index, part, leaf = key.split(".")  # blocks.1.out_a.weight
        whole = weights[f"encoder.layer.{index}.output.dense.{leaf}"]
        half = model.blocks[int(index)].half
        if leaf == "bias":
            state[key] = whole.clone()
        else:
            state[key] = (whole[:, :half] if part == "out_a" else whole[:, half:]).clone()
    model.load_state_dict(state)
    return model.eval()


def faulty(reference: Any) -> adv_bert.Bert:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].norm2.eps = 1e-5
    return model
