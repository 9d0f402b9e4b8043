"""Scripted, partly compiled and quantized ports, other ways than ``truth_compiled``
(imports only torch and ``adv_bert``). Faults sit in layer 1.

- ``*_scripted``: every block ``torch.jit.script``-ed inside an eager model; the faulty
  one takes the tanh GELU in layer 1;
- ``faulty_scripted_scale``: the same, layer 1's scores scaled by 1/head_dim;
- ``*_compiled_layer``: ``torch.compile(backend="eager")`` on layer 1's block only;
- ``*_module_compile``: ``nn.Module.compile(backend="eager")`` (in place) on layer 1;
- ``*_quantized``: ``quantize_dynamic`` int8; the faulty one adds 0.5 to layer 1's FFN
  input bias (diff with --atol 0.1: int8 moves the outputs by ~1e-2).
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F
from torch import nn


class TanhBlock(adv_bert.Block):
    """TorchScript-able: no ``torch.finfo`` (the mask fills float32's lowest)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.approximate = "none"

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) * self.scale()  # (B, nh, S, S)
        scores = scores.masked_fill(~mask, -3.4028234663852886e38)
        y = scores.softmax(-1) @ v  # (B, nh, S, hd)
        return y.transpose(1, 2).reshape(B, S, H)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate=self.approximate)


def _port(reference, tanh: bool):
    model = adv_bert.build(reference, TanhBlock)
    if tanh:
        model.blocks[1].approximate = "tanh"
    return model


class ScriptedTanhBlock(TanhBlock):
    """A class of its own: TorchScript compiles each class once (the port's two twins)."""


def _scripted(reference, tanh):
    model = adv_bert.build(reference, ScriptedTanhBlock if tanh else TanhBlock)
    if tanh:
        model.blocks[1].approximate = "tanh"
    model.blocks = nn.ModuleList(torch.jit.script(b) for b in model.blocks)
    return model


def correct_scripted(reference):
    return _scripted(reference, False)


def faulty_scripted(reference):
    return _scripted(reference, True)


class ScriptedScaleBlock(TanhBlock):
    """Scores scaled by 1/head_dim, not its square root: a fault that moves the loss."""

    def scale(self) -> float:
        return 1.0 / self.head_dim


def faulty_scripted_scale(reference):
    """Scripted blocks, layer 1's scores scaled by 1/head_dim (its loss moves by more than
    the own backwards' tolerance: they prove nothing)."""
    model = adv_bert.build(reference, TanhBlock)
    scaled = adv_bert.build(reference, ScriptedScaleBlock)
    model.blocks[1] = scaled.blocks[1]
    model.blocks = nn.ModuleList(torch.jit.script(b) for b in model.blocks)
    return model


def _compiled_layer(reference, tanh):
    model = _port(reference, tanh)
    model.blocks[1] = torch.compile(model.blocks[1], backend="eager")
    return model


def correct_compiled_layer(reference):
    return _compiled_layer(reference, False)


def faulty_compiled_layer(reference):
    return _compiled_layer(reference, True)


def _module_compile(reference, tanh):
    model = _port(reference, tanh)
    model.blocks[1].compile(backend="eager")
    return model


def correct_module_compile(reference):
    return _module_compile(reference, False)


def faulty_module_compile(reference):
    return _module_compile(reference, True)


def _quantized(reference, shift):
    model = adv_bert.build(reference)
    with torch.no_grad():
        model.blocks[1].ffn_in.bias.add_(shift)
    return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def correct_quantized(reference):
    return _quantized(reference, 0.0)


def faulty_quantized(reference):
    return _quantized(reference, 0.5)
