"""Closure variable: each layer's activation is a function closing over its approximation."""

import adv_bert
import torch.nn.functional as F


def make_activation(approx):
    def activation(h):
        return F.gelu(h, approximate=approx)
    return activation


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.act_fn = make_activation("none")

    def activation(self, h):
        return self.act_fn(h)


def _build(reference, approx):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].act_fn = make_activation(approx)
    return model


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
