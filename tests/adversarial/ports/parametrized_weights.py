"""BERT whose Linear weights are stored transposed and made by a registered
parametrization (``torch.nn.utils.parametrize``; imports only torch and ``adv_bert``;
probe round s). Under torch.fx each weight is computed from the trace's fake values, and
the heads' trace of a faulty twin raised out of the diff ("internal error: ... references
nonexistent attribute _tensor_constant0"), with no verdict.

- ``correct``: BERT's arithmetic;
- ``faulty``: the same, layer 3's attention LayerNorm (1's on bert-tiny) with eps 1e-5.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
from torch import nn
from torch.nn.utils import parametrize


class Block(adv_bert.Block):
    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape  # (a float32 mask value: torch.fx traces this port whole)
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) * self.scale()  # (B, nh, S, S)
        scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        y = torch.softmax(scores, dim=-1) @ v  # (B, nh, S, hd)
        return y.transpose(1, 2).reshape(B, S, H)


class Transposed(nn.Module):
    def forward(self, stored: torch.Tensor) -> torch.Tensor:
        return stored.t()

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.t().contiguous()


def _parametrized(model: nn.Module) -> nn.Module:
    for module in list(model.modules()):
        if isinstance(module, nn.Linear):
            parametrize.register_parametrization(module, "weight", Transposed())
    return model.eval()


def correct(reference: Any) -> nn.Module:
    return _parametrized(adv_bert.build(reference, Block))


def faulty(reference: Any) -> nn.Module:
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].norm1.eps = 1e-5
    return _parametrized(model)
