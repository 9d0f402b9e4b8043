"""A helper module of ``helper_module.py``: the same name, the tanh GELU."""

import torch.nn.functional as F


def activation(h):
    return F.gelu(h, approximate="tanh")
