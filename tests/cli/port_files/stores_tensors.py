"""The example port, its blocks keeping tensors on themselves as tutorials do.

``self.last = y`` and ``self.history[step] = y`` leave fx Proxies on the module while it is
traced; they must be gone after, or the next trace (and a deepcopy) trips on them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ci" / "my_port.py"
_spec = importlib.util.spec_from_file_location("_stores_my_port", _EXAMPLE)
my_port = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(my_port)


class StoringBlock(my_port.Block):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = super().forward(x, mask)
        self.last = y  # (B, S, H), kept for inspection
        self.history[len(self.history)] = y  # (a list attribute trips layer replay)
        return y


def build(reference: Any) -> torch.nn.Module:
    model = my_port.build(reference)
    for block in model.blocks:
        block.__class__ = StoringBlock
        block.last = None
        block.history = {}
    return model
