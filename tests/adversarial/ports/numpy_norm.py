"""A LayerNorm computed in NumPy, its fault large (imports only torch, NumPy and
``adv_bert``).

Layer 1's second LayerNorm is a module of its own holding the reference's
weight and bias, computing in NumPy (no autograd sees it, the recording cannot either).

- ``correct``: the LayerNorm as BERT's;
- ``faulty``: its bias added twice (the outputs move by about 0.4: module evidence met no
  reference value near its output, and the recording, blind to NumPy, first saw the
  difference a layer later).
"""

from __future__ import annotations

import adv_bert
import numpy as np
import torch
from torch import nn


class NumpyNorm(nn.Module):
    def __init__(self, norm: nn.LayerNorm, twice: bool) -> None:
        super().__init__()
        self.weight, self.bias, self.eps, self.twice = norm.weight, norm.bias, norm.eps, twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = x.detach().numpy().astype(np.float64)
        mean = values.mean(-1, keepdims=True)
        variance = ((values - mean) ** 2).mean(-1, keepdims=True)
        normed = (values - mean) / np.sqrt(variance + self.eps)
        bias = self.bias.detach().numpy() * (2 if self.twice else 1)
        return torch.from_numpy(normed * self.weight.detach().numpy() + bias).to(x.dtype)


def _built(reference, twice):
    model = adv_bert.build(reference)
    block = model.blocks[1]
    block.norm2 = NumpyNorm(block.norm2, twice)
    return model


def correct(reference):
    return _built(reference, False)


def faulty(reference):
    return _built(reference, True)
