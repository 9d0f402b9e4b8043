"""Class attribute: layer N is an instance of a subclass made with ``type()``, of the same
name and forward, whose only difference is the class attribute ``APPROX``."""

import adv_bert
import torch.nn.functional as F


class Block(adv_bert.Block):
    APPROX = "none"

    def activation(self, h):
        return F.gelu(h, approximate=self.APPROX)


def _build(reference, approx):
    layer = adv_bert.fault_layer(reference)
    special = type("Block", (Block,), {"APPROX": approx, "__module__": Block.__module__})

    def block(index, *args):
        return (special if index == layer else Block)(index, *args)

    return adv_bert.build(reference, block)


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
