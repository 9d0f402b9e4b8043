"""A port whose forward edits its own weights on every call (imports torch only): the
from-scratch shape of BERT does not matter here, so it wraps a copy of the reference and
scales one Linear's weight through ``.data`` before each call (no version counter sees it)."""

from __future__ import annotations

import copy

import torch


class Drifting(torch.nn.Module):
    def __init__(self, reference: torch.nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(reference)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        dense = self.inner.encoder.layer[1].intermediate.dense
        dense.weight.data *= 1.001
        out = self.inner(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
