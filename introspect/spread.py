"""Indices spread evenly over a tensor's elements, exact at any size.

``torch.linspace`` steps in float32 by default: above 2**24 elements (a 22M-element
weight held as one flat parameter) its points round past the last index, and picking
them raises ``IndexError``. Below that, the float32 points are kept, so every sample a
golden file or key holds stays as it was.
"""

from __future__ import annotations

import torch

_EXACT_IN_FLOAT32 = 2 ** 24


def index_dtype(size: int) -> torch.dtype:
    """The dtype ``torch.linspace`` must step in to reach index ``size - 1`` exactly."""
    return torch.float32 if size <= _EXACT_IN_FLOAT32 else torch.float64


def spread(size: int, count: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``min(size, count)`` indices from 0 to ``size - 1``, first and last included, as
    ``torch.linspace(...).long()`` gives them, each within ``range(size)``."""
    return torch.linspace(0, max(size - 1, 0), min(size, count), dtype=index_dtype(size),
                          device=device).long()


__all__ = ["index_dtype", "spread"]
