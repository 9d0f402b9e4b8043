"""Private attribute: layer N's ``self._approx`` picks the tanh GELU (the other layers erf)."""

import adv_bert
import torch.nn.functional as F


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._approx = "none"

    def activation(self, h):
        return F.gelu(h, approximate=self._approx)


def _build(reference, approx):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)]._approx = approx
    return model


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
