"""Environment variable read in forward: ``ADV_PORT_TANH_LAYER`` names the tanh layer."""

import os

import adv_bert
import torch.nn.functional as F

VARIABLE = "ADV_PORT_TANH_LAYER"


class Block(adv_bert.Block):
    def activation(self, h):
        tanh = os.environ.get(VARIABLE, "") == str(self.index)
        return F.gelu(h, approximate="tanh" if tanh else "none")


def faulty(reference):
    os.environ[VARIABLE] = str(adv_bert.fault_layer(reference))
    return adv_bert.build(reference, Block)


def correct(reference):
    os.environ[VARIABLE] = ""
    return adv_bert.build(reference, Block)
