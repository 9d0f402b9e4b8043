"""BERT on ``F.scaled_dot_product_attention`` with a boolean mask and its own ``scale=``
(imports only torch and ``adv_bert``; probe round s). The recording keeps the mask as a
constant; the faulty twin's FAIL said "weight _tensor_constant0 matches no weight of
the reference ... left unloaded", of the mask.

- ``correct``: BERT's arithmetic;
- ``faulty``: the same, layer 3's scale (1's on bert-tiny) off by 1e-3 of it.
"""

from __future__ import annotations

import math
from typing import Any

import adv_bert
import torch
import torch.nn.functional as F


class SdpaBlock(adv_bert.Block):
    scale_slip = 0.0

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scale = (1 / math.sqrt(self.head_dim)) * (1 + self.scale_slip)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return y.transpose(1, 2).reshape(B, S, H)


def correct(reference: Any) -> adv_bert.Bert:
    return adv_bert.build(reference, SdpaBlock)


def faulty(reference: Any) -> adv_bert.Bert:
    model = adv_bert.build(reference, SdpaBlock)
    model.blocks[adv_bert.fault_layer(reference)].scale_slip = 1e-3
    return model
