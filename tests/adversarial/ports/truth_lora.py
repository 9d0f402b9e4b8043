"""An unmerged LoRA on layer 1's FFN input projection, as PEFT computes it (imports only
torch and ``adv_bert``): the base weight is stored with the adapter taken out
(``W - BA``) and the low-rank path is added after the base matmul:
``x (W - BA)^T + b + (x A^T) B^T``.

- ``correct``: exactly that (within rounding of the reference's ``x W^T + b``);
- ``faulty``: the low-rank path scaled by 2 (``lora_alpha / r`` off by a factor of two).
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F
from torch import nn


class LoRABlock(adv_bert.Block):
    lora_scale = 1.0

    def add_lora(self, rank: int = 4) -> None:
        g = torch.Generator().manual_seed(7)
        base = self.ffn_in
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(base.out_features, rank, generator=g) * 0.1)
        with torch.no_grad():
            base.weight.sub_(self.lora_b @ self.lora_a)  # the adapter out of the base

    def forward(self, x, mask):
        if not hasattr(self, "lora_a"):
            return super().forward(x, mask)
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        h = F.linear(x, self.ffn_in.weight, self.ffn_in.bias)
        h = h + self.lora_scale * ((x @ self.lora_a.T) @ self.lora_b.T)
        return self.norm2(x + self.ffn_out(self.activation(h)))


def _build(reference, scale):
    model = adv_bert.build(reference, LoRABlock)
    model.blocks[1].add_lora()
    model.blocks[1].lora_scale = scale
    return model


def correct(reference):
    return _build(reference, 1.0)


def faulty(reference):
    return _build(reference, 2.0)
