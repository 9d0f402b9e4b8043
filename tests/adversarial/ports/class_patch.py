"""Class patch: the builder assigns ``Block.activation`` after import (monkey-patching)."""

import adv_bert
import torch.nn.functional as F


class Block(adv_bert.Block):
    pass


def _exact(self, h):
    return F.gelu(h)


def _build(reference, tanh_layer):
    def patched(self, h):
        return F.gelu(h, approximate="tanh" if self.index == tanh_layer else "none")

    Block.activation = patched if tanh_layer is not None else _exact
    return adv_bert.build(reference, Block)


def faulty(reference):
    return _build(reference, adv_bert.fault_layer(reference))


def correct(reference):
    return _build(reference, None)
