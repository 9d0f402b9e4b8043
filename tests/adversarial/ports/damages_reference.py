"""A build that scales one of the reference's weights in place (must be refused, exit 2)."""

import copy

import torch


def build(reference):
    model = copy.deepcopy(reference.model).eval()
    with torch.no_grad():
        reference.model.encoder.layer[1].output.dense.weight.mul_(1.01)  # the damage
    return model
