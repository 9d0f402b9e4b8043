"""Forwards that depend on how, or how often, they are called (imports only torch and the
sibling ``adv_bert``).

- ``faulty_grad`` / ``correct_grad``: layer 1 branches on ``torch.is_grad_enabled()``; the
  faulty branch scales the block's output by 1.01 (wrong only in a plain ``model(**x)``),
  the correct one clones it;
- ``faulty_counter`` / ``correct_counter``: the forward counts its calls; the faulty one
  takes the tanh GELU in layer 1 from its second call on, the correct one only counts.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F


class GradBlock(adv_bert.Block):
    scale_when_grad = 1.01

    def forward(self, x, mask):
        y = super().forward(x, mask)
        if torch.is_grad_enabled() and self.index == 1:
            return y * self.scale_when_grad if self.scale_when_grad != 1.0 else y.clone()
        return y


class CountingBert(adv_bert.Bert):
    def __init__(self, config, late_fault: bool) -> None:
        super().__init__(config)
        self.calls = 0
        self.late_fault = late_fault

    def forward(self, input_ids, token_type_ids, attention_mask):
        self.calls += 1
        approx = "tanh" if self.late_fault and self.calls > 1 else "none"
        for block in self.blocks:
            block.activation = (lambda h, a=approx: F.gelu(h, approximate=a)) \
                if block.index == 1 else block.activation
        return super().forward(input_ids, token_type_ids, attention_mask)


def faulty_grad(reference):
    return adv_bert.build(reference, GradBlock)


def correct_grad(reference):
    model = adv_bert.build(reference, GradBlock)
    for block in model.blocks:
        block.scale_when_grad = 1.0
    return model


def faulty_counter(reference):
    return adv_bert.load(CountingBert(reference.config, late_fault=True), reference)


def correct_counter(reference):
    return adv_bert.load(CountingBert(reference.config, late_fault=False), reference)
