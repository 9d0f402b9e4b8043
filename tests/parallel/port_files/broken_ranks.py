"""Ports that break on one rank only: a build that raises, a forward that ends its process
(with an error code, or with 0 as if all went well) or never returns."""

from __future__ import annotations

import os
import time

import torch.distributed as dist
from torch import nn


class _Exits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        if dist.get_rank() == 1:
            os._exit(7)  # as a crashed worker does, with no Python error
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                          attention_mask=attention_mask)


def build_raises(reference):
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 found no weights for its shard")
    return reference.model


def build_exits(reference):
    return _Exits(reference.model)


class _Hangs(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        if dist.get_rank() == 1:
            time.sleep(3600)  # a deadlocked worker
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                          attention_mask=attention_mask)


def build_hangs(reference):
    return _Hangs(reference.model)


class _ExitsZero(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        if dist.get_rank() == 1:
            os._exit(0)  # ends its process as if all went well
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                          attention_mask=attention_mask)


def build_exits_zero(reference):
    return _ExitsZero(reference.model)
