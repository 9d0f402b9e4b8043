"""``id(self)``-keyed state: LayerNorm eps comes from a module dict keyed on ``id(self)``;
the faulty builder gives layer N's second LayerNorm eps 1e-3."""

import adv_bert
import torch.nn.functional as F
from torch import nn

EPS_BY_ID = {}


class KeyedLayerNorm(nn.LayerNorm):
    def forward(self, x):
        eps = EPS_BY_ID.get(id(self), self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps)


class Block(adv_bert.Block):
    def __init__(self, index, hidden, heads, ffn, eps) -> None:
        super().__init__(index, hidden, heads, ffn, eps)
        self.norm1 = KeyedLayerNorm(hidden, eps=eps)
        self.norm2 = KeyedLayerNorm(hidden, eps=eps)


def _build(reference, eps):
    model = adv_bert.build(reference, Block)
    for module in model.modules():  # an id freed by an earlier build's module can come back
        EPS_BY_ID.pop(id(module), None)
    norm = model.blocks[adv_bert.fault_layer(reference)].norm2
    EPS_BY_ID[id(norm)] = eps if eps is not None else norm.eps
    return model


def faulty(reference):
    return _build(reference, 1e-3)


def correct(reference):
    return _build(reference, None)
