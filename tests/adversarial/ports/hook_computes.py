"""Part of a layer's computation done by a forward hook (imports only torch and
``adv_bert``).

The builder registers a forward hook on layer ``fault_layer``'s up-projection that returns
the GELU of its output, and the block's own activation is the identity: what the next
module takes is the GELU, as in BERT. A global forward hook (the diff's) sees the
Linear's output before the module's own hook changes it.

- ``correct``: the hook applies the exact (erf) GELU;
- ``faulty``: the hook applies the tanh GELU.
"""

from __future__ import annotations

import adv_bert
import torch.nn.functional as F


class HookedBlock(adv_bert.Block):
    hooked = -1

    def activation(self, h):
        return h if self.index == self.hooked else F.gelu(h)


def _hooked(reference, approximate):
    model = adv_bert.build(reference, HookedBlock)
    layer = adv_bert.fault_layer(reference)
    for block in model.blocks:
        block.hooked = layer
    model.blocks[layer].ffn_in.register_forward_hook(
        lambda module, args, output: F.gelu(output, approximate=approximate))
    return model


def correct(reference):
    return _hooked(reference, "none")


def faulty(reference):
    return _hooked(reference, "tanh")
