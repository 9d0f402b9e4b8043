"""How the differences of one compared node spread: a count of elements per decade of
``|ref - cand|``, on real-token positions (what ``measure`` already takes the maximum of).

Fourteen fixed bins, so every node's histogram reads the same and a page can embed one
per node: exactly 0, below 1e-10, one per decade from 1e-10 to 10, and 10 or more (an
Inf or a NaN on one side lands there too). The bins are decades of the float value;
rounding in ``log10`` may move an element lying exactly on a power of ten by one bin.
"""

from __future__ import annotations

import torch

# Bin labels, in order: each decade bin is [10^k, 10^(k+1)).
ERROR_BINS = ("0", "<1e-10", *(f"1e{k}" for k in range(-10, 1)), ">=10")
_LOWEST, _HIGHEST = -11, 1  # floor(log10(d)) of the "<1e-10" bin, of the ">=10" bin


def exact_histogram(elements: int) -> tuple[int, ...]:
    """Every element equal: all in the first bin."""
    return (elements,) + (0,) * (len(ERROR_BINS) - 1)


def error_histogram(d: torch.Tensor, pad: torch.Tensor | None) -> tuple[int, ...]:
    """Counts per bin of the absolute differences ``d`` (NaN already replaced by Inf),
    padding positions (``pad`` True, broadcast onto ``d``) left out."""
    if d.numel() == 0:
        return exact_histogram(0)
    decade = torch.log10(d).floor_().clamp_(_LOWEST, _HIGHEST)
    index = (decade - (_LOWEST - 1)).to(torch.int64).masked_fill_(d == 0, 0)
    outside = len(ERROR_BINS)  # padding counted in a bin of its own, then dropped
    if pad is not None:
        index = index.masked_fill(pad, outside)
    counts = torch.bincount(index.flatten(), minlength=outside + 1)
    return tuple(int(c) for c in counts[:outside].tolist())


__all__ = ["ERROR_BINS", "error_histogram", "exact_histogram"]
