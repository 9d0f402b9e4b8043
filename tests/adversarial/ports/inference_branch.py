"""A layer that branches on ``torch.is_inference_mode_enabled()`` (imports only torch).

Written from ``adv_bert``'s ``Block``: in layer ``fault_layer``, the faulty twin scales
its attention scores 1% too far, under ``torch.inference_mode()`` only. That moves
bert-tiny's outputs there by 5e-5, under their budget, and the calls module evidence
captures (autograd on, ``no_grad``) and the recording never take the branch.

- ``correct``: the same branch, computing the same scale;
- ``faulty``: the scale 1.01 / sqrt(head_dim) under inference mode.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from adv_bert import Block, build, fault_layer


class Branching(Block):
    off = 1.0

    def scale(self) -> float:
        if torch.is_inference_mode_enabled():
            return self.off / math.sqrt(self.head_dim)
        return 1 / math.sqrt(self.head_dim)


def _build(reference: Any, off: float) -> Any:
    model = build(reference, Branching)
    model.blocks[fault_layer(reference)].off = off
    return model


def correct(reference: Any) -> Any:
    return _build(reference, 1.0)


def faulty(reference: Any) -> Any:
    return _build(reference, 1.01)
