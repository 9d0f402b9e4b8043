"""BERT whose value bias is folded into the attention output projection's bias (imports
only torch and ``adv_bert``; probe round s). Each row of attention weights sums to 1, so
``softmax(s) @ (x W_v + b_v) = softmax(s) @ x W_v + b_v``, and the projection after it
may add ``W_o @ b_v`` to its own bias instead: ``b_o' = b_o + W_o @ b_v``, computed once
in float32 when the port is built. The key bias may go too (the softmax takes away what
it adds to a query's row).

Both correct ports FAILED: at layer 3's value Linear by ``|b_v|`` (0.09), and, with the
key bias gone too, at layer 0's key, whose holder, run in float64, differed from the
reference's by the folded bias's float32 rounding.

- ``correct``: the value bias folded, in every layer;
- ``correct_keyless``: the same, and no key bias;
- ``faulty``, ``faulty_keyless``: the same, layer 3's folded bias (1's on bert-tiny)
  rounded through float16.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


def _folded(reference: Any, keyless: bool, rounded_in: int | None) -> adv_bert.Bert:
    model = adv_bert.build(reference)
    with torch.no_grad():
        for index, block in enumerate(model.blocks):
            bias = block.proj.bias + block.proj.weight @ block.v.bias
            if index == rounded_in:
                bias = bias.half().float()
            block.proj.bias.copy_(bias)
            block.v.bias.zero_()
            if keyless:
                block.k.bias.zero_()
    return model.eval()


def correct(reference: Any) -> adv_bert.Bert:
    return _folded(reference, keyless=False, rounded_in=None)


def correct_keyless(reference: Any) -> adv_bert.Bert:
    return _folded(reference, keyless=True, rounded_in=None)


def faulty(reference: Any) -> adv_bert.Bert:
    return _folded(reference, keyless=False, rounded_in=adv_bert.fault_layer(reference))


def faulty_keyless(reference: Any) -> adv_bert.Bert:
    return _folded(reference, keyless=True, rounded_in=adv_bert.fault_layer(reference))
