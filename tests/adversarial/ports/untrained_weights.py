"""``adv_bert``'s BERT with one weight of one layer's feed-forward input trained otherwise
than the reference's, its forward bit for bit the same (imports only torch; probe round m):

- ``weight_as_buffer``: the weight registered as a buffer (never trains);
- ``frozen_weight``: a parameter with ``requires_grad`` off;
- ``weight_detached``: read as ``weight.detach()`` in ``F.linear`` (no gradient reaches it);
- ``half_gradient``: read as ``w.detach() + (w - w.detach()) * 0.5`` (half its gradient);
- ``correct``: the twin, read as it is.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from adv_bert import build, fault_layer
from torch import nn


class OddLinear(nn.Module):
    """A Linear whose weight reaches autograd as ``how`` says."""

    def __init__(self, linear: nn.Linear, how: str) -> None:
        super().__init__()
        self.how = how
        if how == "buffer":
            self.register_buffer("weight", linear.weight.detach().clone())
        else:
            self.weight = nn.Parameter(linear.weight.detach().clone(),
                                       requires_grad=how != "frozen")
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        w = self.weight
        if self.how == "detached":
            w = w.detach()
        elif self.how == "half":
            w = w.detach() + (w - w.detach()) * 0.5
        return F.linear(x, w, self.bias)


def _with(reference: Any, how: str) -> nn.Module:
    model = build(reference)
    block = model.blocks[fault_layer(reference)]
    block.ffn_in = OddLinear(block.ffn_in, how)
    return model


def correct(reference):
    return _with(reference, "plain")


def weight_as_buffer(reference):
    return _with(reference, "buffer")


def frozen_weight(reference):
    return _with(reference, "frozen")


def weight_detached(reference):
    return _with(reference, "detached")


def half_gradient(reference):
    return _with(reference, "half")
