"""Linears whose bias is not added onto their product (imports only torch).

Written from ``adv_bert``'s ``Block``, its weights used by hand: ``x @ W.T`` and the bias
added where the writer liked it:

- ``before``: the bias added to the residual first, ``(x + b) + a @ W.T``;
- ``after``: the residual first, ``(a @ W.T + x) + b``;
- ``per_head``: queries, keys and values as bias-free products split into heads, each
  bias added per head (``b.view(heads, 1, head_size)``);
- ``stacked``: the three terms stacked and summed, ``stack([x, a @ W.T, b]).sum(0)``.

Faults, in layer ``fault_layer``: ``faulty`` (the ``after`` form with the tanh GELU) and
``faulty_no_bias`` (the ``before`` form, the attention output's bias left out).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from adv_bert import Block, build, fault_layer


class BiasElsewhere(Block):
    form = "before"
    tanh = False
    drop_bias = False

    def residual(self, linear: torch.nn.Linear, a: torch.Tensor, x: torch.Tensor,
                 use_bias: bool = True) -> torch.Tensor:
        product = a @ linear.weight.T
        b = linear.bias if use_bias else torch.zeros_like(linear.bias)
        if self.form == "after":
            return (product + x) + b
        if self.form == "stacked":
            return torch.stack([x, product, b.expand_as(x)]).sum(0)
        return (x + b) + product  # before, per_head

    def split_biased(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        B, S, _ = x.shape
        heads = (x @ linear.weight.T).view(B, S, self.heads, self.head_dim).transpose(1, 2)
        return heads + linear.bias.view(self.heads, 1, self.head_dim)

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.form != "per_head":
            return super().attend(x, mask)
        B, S, H = x.shape
        q, k, v = (self.split_biased(x, m) for m in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) * self.scale()
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(self.residual(self.proj, self.attend(x, mask), x,
                                     use_bias=not self.drop_bias))
        h = F.gelu(self.ffn_in(x), approximate="tanh" if self.tanh else "none")
        return self.norm2(self.residual(self.ffn_out, h, x))


def _build(reference: Any, form: str, tanh: bool = False, drop_bias: bool = False) -> Any:
    model = build(reference, BiasElsewhere)
    for index, block in enumerate(model.blocks):
        block.form = form
        if index == fault_layer(reference):
            block.tanh, block.drop_bias = tanh, drop_bias
    return model


def before(reference: Any) -> Any:
    return _build(reference, "before")


def after(reference: Any) -> Any:
    return _build(reference, "after")


def per_head(reference: Any) -> Any:
    return _build(reference, "per_head")


def stacked(reference: Any) -> Any:
    return _build(reference, "stacked")


def faulty(reference: Any) -> Any:
    return _build(reference, "after", tanh=True)


def faulty_no_bias(reference: Any) -> Any:
    return _build(reference, "before", drop_bias=True)
