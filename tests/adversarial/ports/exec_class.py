"""A class defined by ``exec`` (a notebook cell): layer N's activation module is an
instance of ``Gelu`` defined from a source string; faulty and correct cells differ in
one word, have the same class name, and ``inspect.getsource`` cannot see either."""

import adv_bert
import torch
import torch.nn.functional as F

CELL = '''
class Gelu(torch.nn.Module):
    def forward(self, h):
        return F.gelu(h, approximate="{approx}")
'''


def cell_class(approx):
    namespace = {"torch": torch, "F": F, "__name__": "__main__"}
    exec(CELL.format(approx=approx), namespace)  # as a notebook cell would define it
    return namespace["Gelu"]


class Block(adv_bert.Block):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.act = cell_class("none")()

    def activation(self, h):
        return self.act(h)


def _build(reference, approx):
    model = adv_bert.build(reference, Block)
    model.blocks[adv_bert.fault_layer(reference)].act = cell_class(approx)()
    return model


def faulty(reference):
    return _build(reference, "tanh")


def correct(reference):
    return _build(reference, "none")
