"""BERT computing its LayerNorms in float64 and casting back (imports only torch and
``adv_bert``; probe round s). The faulty twin's LayerNorm in layer 3 (1's on bert-tiny)
divides by the unbiased variance; its FAIL was hinted both by that, which reproduces the
candidate's values, and by "the candidate computes in float64 and the reference in
float32: rounding alone can exceed the default budget", which sent its user to rounding.

- ``correct``: LayerNorm over float64, cast back to float32;
- ``faulty``: the same, layer 3's attention LayerNorm with the unbiased variance.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
from torch import nn


class Float64Norm(nn.LayerNorm):
    unbiased = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.double()
        mean = h.mean(-1, keepdim=True)
        var = h.var(-1, keepdim=True, unbiased=self.unbiased)
        y = (h - mean) / torch.sqrt(var + self.eps) * self.weight.double() + self.bias.double()
        return y.float()


def _in_float64(model: adv_bert.Bert) -> adv_bert.Bert:
    for block in model.blocks:
        for name in ("norm1", "norm2"):
            old = getattr(block, name)
            norm = Float64Norm(old.normalized_shape, eps=old.eps)
            norm.load_state_dict(old.state_dict())
            setattr(block, name, norm)
    return model.eval()


def correct(reference: Any) -> adv_bert.Bert:
    return _in_float64(adv_bert.build(reference))


def faulty(reference: Any) -> adv_bert.Bert:
    model = _in_float64(adv_bert.build(reference))
    model.blocks[adv_bert.fault_layer(reference)].norm1.unbiased = True
    return model
