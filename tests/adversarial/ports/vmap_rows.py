"""A layer mapped over the batch's rows with ``torch.func.vmap`` (imports only torch and
``adv_bert``): each row runs the layer as a batch of one.

- ``correct``: layer ``fault_layer`` under ``vmap`` over rows;
- ``faulty``: the same, with the tanh GELU in that layer.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F


class RowMappedBlock(adv_bert.Block):
    approximate = "none"
    mapped = -1

    def activation(self, h):
        return F.gelu(h, approximate=self.approximate if self.index == self.mapped else "none")

    def forward(self, x, mask):
        if self.index != self.mapped:
            return super().forward(x, mask)
        one = super().forward
        return torch.func.vmap(lambda row, m: one(row[None], m[None])[0])(x, mask)


def _mapped(reference, approximate):
    model = adv_bert.build(reference, RowMappedBlock)
    for block in model.blocks:
        block.mapped = adv_bert.fault_layer(reference)
        block.approximate = approximate
    return model


def correct(reference):
    return _mapped(reference, "none")


def faulty(reference):
    return _mapped(reference, "tanh")
