"""Beside b/port.py: the tanh GELU, the fault."""

import torch


def make_act() -> torch.nn.Module:
    return torch.nn.GELU(approximate="tanh")
