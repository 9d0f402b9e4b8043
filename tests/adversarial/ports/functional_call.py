"""BERT whose weights are buffers of the port, handed for each call to a randomly
initialised skeleton by ``torch.func.functional_call`` (the way a port written with
``torch.func`` holds them). The skeleton's own weights are never the reference's: the
recording read its Linears' and LayerNorms' weights from it once the call returned.
``faulty`` loads layer N's attention LayerNorm weight from layer N - 1. (Imports only torch
and ``adv_bert``.)"""

from __future__ import annotations

import adv_bert
import torch
from torch import nn


class FunctionalCallBert(nn.Module):
    def __init__(self, reference, from_previous_layer=None):
        super().__init__()
        self.skeleton = adv_bert.Bert(reference.config)  # random init, never loaded
        weights = adv_bert.load(adv_bert.Bert(reference.config), reference).state_dict()
        if from_previous_layer is not None:
            n = from_previous_layer
            weights[f"blocks.{n}.norm1.weight"] = weights[f"blocks.{n - 1}.norm1.weight"]
        self.names = list(weights)
        for i, name in enumerate(self.names):
            self.register_buffer(f"w{i}", weights[name].detach().clone())

    def forward(self, input_ids, token_type_ids, attention_mask):
        weights = {name: getattr(self, f"w{i}") for i, name in enumerate(self.names)}
        return torch.func.functional_call(self.skeleton, weights,
                                          (input_ids, token_type_ids, attention_mask))


def correct(reference):
    return FunctionalCallBert(reference).eval()


def faulty(reference):
    return FunctionalCallBert(reference, adv_bert.fault_layer(reference)).eval()
