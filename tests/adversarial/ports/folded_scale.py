"""A port with the attention's 1/sqrt(d) folded into the query weights (imports only torch).

Written in another hand from ``adv_bert``: the scores by ``baddbmm`` with the mask as its
input and ``alpha=1``, heads folded into the batch, residuals added in place. The query
Linear's weights and bias are the reference's times 1/sqrt(d) at load time, so no weight
of the reference holds them and the query Linear can only be paired by structure: its
output is the reference's over sqrt(d), and every later value agrees (exactly on
bert-tiny, where d = 64; to rounding on MiniLM, d = 32).

- ``correct``: the folded port;
- ``faulty``: the same with the tanh GELU in layer ``fault_layer``;
- ``faulty_scale``: the same with the folded factor 1.01 off in layer ``fault_layer``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from adv_bert import Bert, Block, fault_layer, load


class FoldedBlock(Block):
    approximate = "none"

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape

        def heads_first(t: torch.Tensor) -> torch.Tensor:  # (B * nh, S, hd)
            return t.view(B, S, self.heads, self.head_dim).transpose(1, 2) \
                .reshape(B * self.heads, S, self.head_dim)

        q, k, v = heads_first(self.q(x)), heads_first(self.k(x)), heads_first(self.v(x))
        blocked = torch.zeros(mask.shape, dtype=x.dtype).masked_fill_(
            ~mask, torch.finfo(x.dtype).min)  # (B, 1, 1, S)
        scores = torch.baddbmm(blocked.expand(B, self.heads, S, S).reshape(
            B * self.heads, S, S), q, k.transpose(1, 2), alpha=1.0)  # scale in q's weights
        mixed = torch.bmm(scores.softmax(-1), v)
        return mixed.view(B, self.heads, S, self.head_dim).transpose(1, 2).reshape(B, S, H)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate=self.approximate)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        a = self.proj(self.attend(x, mask))
        a += x
        x = self.norm1(a)
        h = self.ffn_out(self.activation(self.ffn_in(x)))
        h += x
        return self.norm2(h)


def _build(reference: Any, tanh: bool = False, off: float = 1.0) -> Bert:
    model = load(Bert(reference.config, FoldedBlock), reference)
    faulty = fault_layer(reference)
    with torch.no_grad():
        for index, block in enumerate(model.blocks):
            factor = 1 / math.sqrt(block.head_dim) * (off if index == faulty else 1.0)
            block.q.weight.mul_(factor)
            block.q.bias.mul_(factor)
            if tanh and index == faulty:
                block.approximate = "tanh"
    return model


def correct(reference: Any) -> Bert:
    return _build(reference)


def faulty(reference: Any) -> Bert:
    return _build(reference, tanh=True)


def faulty_scale(reference: Any) -> Bert:
    return _build(reference, off=1.01)
