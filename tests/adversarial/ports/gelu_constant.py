"""A GELU written by hand, ``0.5 * x * (1 + erf(x * c))``: the correct port writes
``c = 1/sqrt(2)`` in full, the faulty one types ``0.7071`` in layer N (a slip of 7e-6 in
the constant: under the float32 budget of the layer, outside its rounding)."""

import math

import adv_bert
import torch


class Block(adv_bert.Block):
    constant = 1 / math.sqrt(2)

    def activation(self, h):
        return 0.5 * h * (1 + torch.erf(h * self.constant))


def _build(reference, constant):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].constant = constant
    return model


def faulty(reference):
    return _build(reference, 0.7071)


def correct(reference):
    return _build(reference, 1 / math.sqrt(2))
