"""Ports for module evidence that reads a submodule's run from its parent's (imports only
torch). Each is HF's own BertModel, copied from the reference, with its first layer's GELU
turned into the tanh GELU: from there on every module sees inputs of its own, so each is
run again on the reference's, mostly inside a parent's run.

- ``tanh_first_layer``: only that fault (a FAIL in ``encoder.layer.0``);
- ``scaled``: each layer's FFN computes a scale per token from its own input (a dither of
  its first feature: 1 + 1e-4 sin(1e5 x)) and hands it to its activation as a second
  argument; run on the reference's inputs, the FFN hands the activation the reference's
  hidden value bit for bit, and the scale of the reference's input, not the one its own
  call took (an input 1e-5 away moves it by its whole 1e-4);
- ``aliased``: each layer's FFN mixes its hidden value with itself (``Mix(h, h)``, the
  mean of its two arguments: ``h`` bit for bit) before the activation; once ``armed``
  (as a module whose state moved since the plain calls), ``Mix`` doubles its first
  argument in place for the sum and halves it back after (memory-saving code does so):
  where both arguments are one tensor it returns 2 h, where they are two copies 1.5 h,
  and its arguments hold after the call what they held before.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def tanh_first_layer(reference) -> nn.Module:
    model = copy.deepcopy(reference.model).eval()
    model.encoder.layer[0].intermediate.intermediate_act_fn = nn.GELU(approximate="tanh")
    return model


class ScaledGELU(nn.Module):
    def forward(self, h: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return F.gelu(h) * scale  # (B, S, I) * (B, S, 1)


class ScaledIntermediate(nn.Module):
    """HF's ``BertIntermediate`` (its ``dense``) with a scale from its own input."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__()
        self.dense = dense
        self.intermediate_act_fn = ScaledGELU()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        scale = 1 + 1e-4 * torch.sin(1e5 * hidden_states[..., :1])  # (B, S, 1)
        return self.intermediate_act_fn(self.dense(hidden_states), scale)


def scaled(reference) -> nn.Module:
    model = tanh_first_layer(reference)
    for layer in model.encoder.layer:
        layer.intermediate = ScaledIntermediate(layer.intermediate.dense)
    return model.eval()


class Mix(nn.Module):
    """The mean of its two arguments; ``armed``: its first doubled in place for the sum."""

    armed = False

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not self.armed:
            return (a + b) / 2
        a.mul_(2)
        mean = (a + b) / 2
        a.div_(2)  # (exact: a holds what it held)
        return mean


class MixedIntermediate(nn.Module):
    def __init__(self, intermediate: nn.Module) -> None:
        super().__init__()
        self.dense = intermediate.dense
        self.mix = Mix()
        self.intermediate_act_fn = intermediate.intermediate_act_fn

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h = self.dense(hidden_states)  # (B, S, I)
        return self.intermediate_act_fn(self.mix(h, h))


def aliased(reference) -> nn.Module:
    model = tanh_first_layer(reference)
    for layer in model.encoder.layer:
        layer.intermediate = MixedIntermediate(layer.intermediate)
    return model.eval()
