"""LoRA adapters written other ways than ``truth_lora`` (imports only torch and
``adv_bert``). The reference's weight W is stored as ``W - s B A`` and the adapter adds
``s (x A^T) B^T`` back: right when the adapter is where it was taken out, at its scale.

- ``*_dropout``: PEFT style, ``nn.Dropout(0.1)`` on the adapter's input (off in eval), on
  layer 1's query; the faulty one calls ``F.dropout(..., training=True)``;
- ``*_scale``: ``lora_alpha / r`` with alpha 8, r 4 on layer 1's output projection; the
  faulty one uses ``alpha`` alone (scale 8 for 2);
- ``*_wrong_layer``: taken out of layer 1's FFN input, the faulty one added back in layer
  0 (the first divergence is layer 0);
- ``*_merged``: the adapter merged into W at build (``W - sBA + sBA``); the faulty one
  merges it twice.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0, seed: int = 3,
                 dropout_always: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.base = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        with torch.no_grad():
            self.lora_A.weight.copy_(torch.randn(rank, base.in_features, generator=g) * 0.1)
            self.lora_B.weight.copy_(torch.randn(base.out_features, rank, generator=g) * 0.1)
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(0.1)
        self.dropout_always = dropout_always

    def delta(self) -> torch.Tensor:
        return self.scaling * self.lora_B.weight @ self.lora_A.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dropped = F.dropout(x, 0.1, training=True) if self.dropout_always else self.dropout(x)
        return self.base(x) + self.lora_B(self.lora_A(dropped)) * self.scaling


def _adapted(reference, block: int, name: str, taken_from: int | None = None,
             **lora) -> nn.Module:
    model = adv_bert.build(reference)
    taken_from = block if taken_from is None else taken_from
    adapter = LoRALinear(getattr(model.blocks[block], name), **lora)
    with torch.no_grad():
        getattr(model.blocks[taken_from], name).weight.sub_(adapter.delta())
    setattr(model.blocks[block], name, adapter)
    return model


def correct_dropout(reference):
    return _adapted(reference, 1, "q")


def faulty_dropout(reference):
    return _adapted(reference, 1, "q", dropout_always=True)


def correct_scale(reference):
    return _adapted(reference, 1, "proj")


def faulty_scale(reference):
    model = _adapted(reference, 1, "proj")
    model.blocks[1].proj.scaling = 8.0
    return model


def correct_wrong_layer(reference):
    return _adapted(reference, 1, "ffn_in")


def faulty_wrong_layer(reference):
    return _adapted(reference, 0, "ffn_in", taken_from=1)


def _merged(reference, times):
    model = _adapted(reference, 1, "ffn_in")
    adapter = model.blocks[1].ffn_in
    with torch.no_grad():
        adapter.base.weight.add_(times * adapter.delta())
    model.blocks[1].ffn_in = adapter.base
    return model


def correct_merged(reference):
    return _merged(reference, 1)


def faulty_merged(reference):
    return _merged(reference, 2)
