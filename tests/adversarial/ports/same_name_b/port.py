"""One of two files named port.py (folder same_name_b): layer 1 (3 on deeper models) uses
the tanh GELU; otherwise the same as same_name_a/port.py."""

import torch.nn.functional as F
from torch import nn


class Act(nn.Module):
    def __init__(self, approx="none"):
        super().__init__()
        self.approx = approx

    def forward(self, h):
        return F.gelu(h, approximate=self.approx)


def build(reference):
    import copy

    model = copy.deepcopy(reference.model).eval()
    bad = 1 if reference.config.num_hidden_layers <= 2 else 3
    for i, layer in enumerate(model.encoder.layer):
        layer.intermediate.intermediate_act_fn = Act("tanh" if i == bad else "none")
    return model
