"""One of two files named port.py (folder same_name_a): the correct BERT."""

import torch.nn.functional as F
from torch import nn


class Act(nn.Module):
    def forward(self, h):
        return F.gelu(h)


def build(reference):
    import copy

    model = copy.deepcopy(reference.model).eval()
    for layer in model.encoder.layer:
        layer.intermediate.intermediate_act_fn = Act()
    return model
