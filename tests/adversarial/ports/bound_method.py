"""Bound method of another object: layer N's activation is ``Activations(approx).apply``."""

import adv_bert
import torch.nn.functional as F


class Activations:
    def __init__(self, approx):
        self.approx = approx

    def apply(self, h):
        return F.gelu(h, approximate=self.approx)


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.act_fn = Activations("none").apply

    def activation(self, h):
        return self.act_fn(h)


def _build(reference, approx):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].act_fn = Activations(approx).apply
    return model


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
