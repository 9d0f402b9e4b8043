"""functools.partial: layer N's activation is ``partial(F.gelu, approximate=...)``."""

import functools

import adv_bert
import torch.nn.functional as F


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.act_fn = functools.partial(F.gelu, approximate="none")

    def activation(self, h):
        return self.act_fn(h)


def _build(reference, approx):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].act_fn = functools.partial(
        F.gelu, approximate=approx)
    return model


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
