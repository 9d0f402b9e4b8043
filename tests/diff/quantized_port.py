"""Int8 ports of a bare BERT encoder, made by ``torch.ao.quantization.quantize_dynamic``
(imports only torch and the adversarial corpus's ``truth_compiled`` and ``adv_bert``).

A builder takes what ``introspect diff --candidate FILE.py:NAME`` passes (``.model``,
``.config``) and returns the port holding the reference's weights, its Linears int8:

- ``correct``: every Linear int8, one scale per tensor;
- ``correct_per_channel``: one scale per output channel;
- ``faulty``: as ``correct``, with no residual around layer 1's feed-forward block;
- ``faulty_tanh``: as ``correct``, with the tanh GELU in layer 1: a fault outside the
  Linears, smaller than int8's error at the outputs (a widened --atol once passed it);
- ``correct_float16``, ``faulty_tanh_float16``: the same with float16 weights
  (``dtype=torch.float16``), which a correct port FAILED with (probe round m).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversarial" / "ports"))

import adv_bert  # noqa: E402
import truth_compiled  # noqa: E402


def correct(reference):
    return truth_compiled.correct_quantized(reference)


def faulty(reference):
    return truth_compiled.faulty_quantized(reference)


def correct_per_channel(reference):
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference),
                                                   {nn.Linear: qconfig}, dtype=torch.qint8)


class _TanhBlock(adv_bert.Block):
    def activation(self, h: torch.Tensor) -> torch.Tensor:
        if self.index == adv_bert.fault_layer(self.config_like):
            return F.gelu(h, approximate="tanh")
        return F.gelu(h)


def faulty_tanh(reference):
    class Block(_TanhBlock):
        config_like = reference

    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference, Block),
                                                   {nn.Linear}, dtype=torch.qint8)


def correct_float16(reference):
    """``quantize_dynamic(dtype=torch.float16)``: float16 weights, float32 inputs."""
    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference), {nn.Linear},
                                                   dtype=torch.float16)


def faulty_tanh_float16(reference):
    class Block(_TanhBlock):
        config_like = reference

    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference, Block),
                                                   {nn.Linear}, dtype=torch.float16)
