"""Ports whose ranks return different outputs: one rank's output cut short, NaN on one
rank, an output one rank leaves out. Each runs the whole model on every rank (no
collectives), so every output should be the same on all ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _OneRankOff(nn.Module):
    def __init__(self, model: nn.Module, fault: str) -> None:
        super().__init__()
        self.model = model
        self.fault = fault

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        hidden, pooled = out.last_hidden_state, out.pooler_output
        if dist.get_rank() == 1:
            if self.fault == "shorter":
                hidden = hidden[:, :-1]  # one position fewer on rank 1
            elif self.fault == "nan":
                hidden = torch.where(input_ids[..., None] == 102, torch.nan, hidden)
            elif self.fault == "missing":
                return {"last_hidden_state": hidden}
        return {"last_hidden_state": hidden, "pooler_output": pooled}


def build_shorter(reference):
    return _OneRankOff(reference.model, "shorter")


def build_nan(reference):
    return _OneRankOff(reference.model, "nan")


def build_missing(reference):
    return _OneRankOff(reference.model, "missing")


def build_same(reference):
    return _OneRankOff(reference.model, "none")
