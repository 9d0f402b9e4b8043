"""Module global: forward reads ``TANH_LAYER`` at call time; the builder sets it."""

import adv_bert
import torch.nn.functional as F

TANH_LAYER = None


class Block(adv_bert.Block):
    def activation(self, h):
        return F.gelu(h, approximate="tanh" if self.index == TANH_LAYER else "none")


def faulty(reference):
    global TANH_LAYER
    TANH_LAYER = adv_bert.fault_layer(reference)
    return adv_bert.build(reference, Block)


def correct(reference):
    global TANH_LAYER
    TANH_LAYER = None
    return adv_bert.build(reference, Block)
