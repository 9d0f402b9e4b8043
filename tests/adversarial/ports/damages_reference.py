"""A build that scales one of the reference's weights in place, then returns a copy of
the damaged reference: both sides agree, and both are wrong (must be refused, exit 2)."""

import copy

import torch


def build(reference):
    with torch.no_grad():
        reference.model.encoder.layer[1].output.dense.weight.mul_(1.01)  # the damage
    return copy.deepcopy(reference.model).eval()
