"""BERT whose FFN adds its first bias inside a TorchScript helper that fuses it with the
GELU, as Megatron's ``bias_gelu`` does (imports only torch and ``adv_bert``; probe round
r). The first Linear runs without its bias: ``F.linear(x, W)``.

The recording does not reach into the scripted helper, so it never saw the bias read,
and the product was compared with the reference's Linear output, bias included: a
correct port FAILED in every layer by the bias's size (0.76 in layer 0).

- ``correct``: the exact GELU, 1/sqrt(2) in full;
- ``faulty``: layer 3's helper with 1/sqrt(2) cut to 0.707.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
import torch.nn.functional as F


@torch.jit.script
def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = x + b
    return y * 0.5 * (1.0 + torch.erf(y * 0.70710678118654752))


@torch.jit.script
def bias_gelu_cut(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = x + b
    return y * 0.5 * (1.0 + torch.erf(y * 0.707))


class ScriptedBlock(adv_bert.Block):
    cut = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        product = F.linear(x, self.ffn_in.weight)  # the bias goes into the helper
        h = (bias_gelu_cut if self.cut else bias_gelu)(product, self.ffn_in.bias)
        return self.norm2(x + self.ffn_out(h))


def correct(reference: Any) -> adv_bert.Bert:
    return adv_bert.build(reference, ScriptedBlock)


def faulty(reference: Any) -> adv_bert.Bert:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].cut = True
    return model
