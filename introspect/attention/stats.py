"""Per-head statistics people study in attention maps (Clark et al., "What does BERT look at?").

For every layer and head, averaged over the real query tokens of every batch row:

- ``entropy``: nats of each query row's distribution (0 = one key; log n = uniform);
- ``to_cls`` / ``to_sep``: weight on the [CLS] key / on all [SEP] keys;
- ``to_self``, ``to_prev``, ``to_next``: weight on the token itself, the one before, the
  one after (rows without such a neighbour are left out of that mean);
- ``max_weight``: each row's largest weight (how peaked the head is).

Example::

    >>> maps.stats().head(2)
       layer  head  entropy  to_cls  to_sep  to_self  to_prev  to_next  max_weight
    0      0     0    1.912   0.120   0.080    0.151    0.133    0.142       0.301
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import pandas

    from introspect.attention.records import AttentionRecord

STAT_COLUMNS = ("entropy", "to_cls", "to_sep", "to_self", "to_prev", "to_next", "max_weight")
CLS_TOKEN, SEP_TOKEN = "[CLS]", "[SEP]"


def _token_flags(maps: AttentionRecord, token: str, fallback_position: str) -> torch.Tensor:
    """``(batch, seq)`` True where the token is ``token``.

    Inputs given without a tokenizer carry ids, not tokens; BERT then has [CLS] first and
    [SEP] last among the real tokens.
    """
    B, S = maps.keep.shape
    flags = torch.tensor([[t == token for t in row] for row in maps.tokens], dtype=torch.bool)
    if flags.shape == (B, S) and flags.any():
        return flags
    flags = torch.zeros(B, S, dtype=torch.bool)
    for b in range(B):
        position = 0 if fallback_position == "first" else maps.length(b) - 1
        flags[b, max(position, 0)] = True
    return flags


def _row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean over batch and query of ``(L, B, nh, S)`` values where ``rows`` ``(B, S)`` holds."""
    weights = rows[None, :, None, :].to(values.dtype)
    count = weights.sum(dim=(1, 3)).clamp_min(1.0)
    return (values * weights).sum(dim=(1, 3)) / count  # (L, nh)


def head_stat_tensors(maps: AttentionRecord) -> dict[str, torch.Tensor]:
    """Each statistic as an ``(layers, heads)`` tensor (see the module docstring)."""
    P = maps.probs  # (L, B, nh, S, S)
    keep = maps.keep  # (B, S)
    S = P.shape[-1]
    cls = _token_flags(maps, CLS_TOKEN, "first").to(P.dtype)
    sep = _token_flags(maps, SEP_TOKEN, "last").to(P.dtype)
    entropy = -(P * P.clamp_min(1e-30).log()).sum(-1)  # (L, B, nh, S)
    prev = torch.zeros_like(entropy)
    prev[..., 1:] = torch.diagonal(P, offset=-1, dim1=-2, dim2=-1)  # P[i, i-1]
    following = torch.zeros_like(entropy)
    following[..., :-1] = torch.diagonal(P, offset=1, dim1=-2, dim2=-1)  # P[i, i+1]
    has_prev = keep.clone()
    has_prev[:, 0] = False
    has_next = keep.clone()
    has_next[:, : S - 1] &= keep[:, 1:]
    has_next[:, S - 1] = False
    return {
        "entropy": _row_mean(entropy, keep),
        "to_cls": _row_mean((P * cls[None, :, None, None, :]).sum(-1), keep),
        "to_sep": _row_mean((P * sep[None, :, None, None, :]).sum(-1), keep),
        "to_self": _row_mean(torch.diagonal(P, dim1=-2, dim2=-1), keep),
        "to_prev": _row_mean(prev, has_prev),
        "to_next": _row_mean(following, has_next),
        "max_weight": _row_mean(P.amax(-1), keep),
    }


def head_stats(maps: AttentionRecord) -> pandas.DataFrame:
    """One row per (layer, head): the statistics of the module docstring.

    Args:
        maps: the attention maps of a batch.

    Returns:
        Columns layer, head, entropy, to_cls, to_sep, to_self, to_prev, to_next,
        max_weight (floats rounded to 6 digits, so tables are stable across runs).
    """
    import pandas as pd

    values = head_stat_tensors(maps)
    L, nh = maps.num_layers, maps.num_heads
    table: dict[str, list[float] | list[int]] = {
        "layer": [layer for layer in range(L) for _ in range(nh)],
        "head": [head for _ in range(L) for head in range(nh)],
    }
    for name in STAT_COLUMNS:
        table[name] = [round(float(v), 6) for v in values[name].reshape(-1)]
    return pd.DataFrame(table)
