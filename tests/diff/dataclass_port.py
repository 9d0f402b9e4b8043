"""Ports whose forward returns a ``@dataclass`` (not a ``ModelOutput``, not a dict), written
without introspect: the reference's own modules under a wrapper, as a user wraps a model
for a library of theirs.

- ``correct``: the reference's outputs, field by field;
- ``faulty``: the hidden states moved by 1e-3 (the pooler untouched);
- ``nested``: a dataclass inside a tuple, beside an int field that carries no value.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass
class Encoded:
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor
    layers: int = 0


class Wrapped(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, shift: float = 0.0, nested: bool = False):
        super().__init__()
        self.inner, self.shift, self.nested = inner, shift, nested

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)
        encoded = Encoded(out.last_hidden_state + self.shift, out.pooler_output, 2)
        return (encoded,) if self.nested else encoded


def correct(reference):
    return Wrapped(copy.deepcopy(reference.model))


def faulty(reference):
    return Wrapped(copy.deepcopy(reference.model), shift=1e-3)


def nested(reference):
    return Wrapped(copy.deepcopy(reference.model), nested=True)
