"""The backward tests' small BERT with dropout written by hand, as ports in other
frameworks write it: ``x * mask``, the mask scaled by ``1 / (1 - p)`` in training and all
ones outside it.

In eval this dropout is still a real op (a product with ones) whose value equals its
input, where HF's ``nn.Dropout`` returns its input itself. ``wrong_scale`` gives it a
custom backward that scales the gradient by 2 (a scale applied in the backward only).
"""

from __future__ import annotations

import torch

from tests.backward.ports import SmallBert

P = 0.1


class _ScaledIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 2.0


class HandDropoutBert(SmallBert):
    def __init__(self, hf: torch.nn.Module, wrong_scale: bool = False) -> None:
        super().__init__(hf)
        self.wrong_scale = wrong_scale

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        if self.wrong_scale:
            return _ScaledIdentity.apply(x)
        mask = torch.bernoulli(torch.full_like(x, 1 - P)) / (1 - P) if self.training \
            else torch.ones_like(x)
        return x * mask

    def lin(self, x, prefix):
        out = super().lin(x, prefix)
        return self.dropout(out) if prefix.endswith("output.dense") else out


def build(reference: torch.nn.Module, wrong_scale: bool = False) -> HandDropoutBert:
    return HandDropoutBert(reference, wrong_scale).eval()
