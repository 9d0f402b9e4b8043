"""Ports that branch on the grad mode, written other ways than ``truth_modes`` (imports only
torch and ``adv_bert``). Each fault sits in layer 1 and scales the block's output by 1.01.

- ``*_inference``: ``torch.is_inference_mode_enabled()`` (wrong only under
  ``torch.inference_mode()``, which many users call for inference);
- ``*_requires_grad``: ``x.requires_grad`` in the block (wrong only under ``no_grad``);
- ``*_hook``: a forward hook on layer 1 that asks ``torch.is_grad_enabled()`` in a helper
  function (wrong only under ``no_grad``);
- ``correct_*``: the same branches taking a clone.
"""

from __future__ import annotations

import adv_bert
import torch


class InferenceBlock(adv_bert.Block):
    factor = 1.01

    def forward(self, x, mask):
        y = super().forward(x, mask)
        if self.index == 1 and torch.is_inference_mode_enabled():
            return y * self.factor
        return y


class RequiresGradBlock(adv_bert.Block):
    factor = 1.01

    def forward(self, x, mask):
        y = super().forward(x, mask)
        if self.index == 1 and not y.requires_grad:
            return y * self.factor
        return y


def _building_gradients() -> bool:
    return torch.is_grad_enabled()


def _build(reference, block, factor):
    model = adv_bert.build(reference, block)
    for b in model.blocks:
        b.factor = factor
    return model


def correct_inference(reference):
    return _build(reference, InferenceBlock, 1.0)


def faulty_inference(reference):
    return _build(reference, InferenceBlock, 1.01)


def correct_requires_grad(reference):
    return _build(reference, RequiresGradBlock, 1.0)


def faulty_requires_grad(reference):
    return _build(reference, RequiresGradBlock, 1.01)


def _hooked(reference, factor):
    model = adv_bert.build(reference)

    def hook(module, args, output):
        return output if _building_gradients() else output * factor

    model.blocks[1].register_forward_hook(hook)
    return model


def correct_hook(reference):
    return _hooked(reference, 1.0)


def faulty_hook(reference):
    return _hooked(reference, 1.01)
