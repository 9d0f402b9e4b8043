"""Each side's key/value cache read as tensors per layer, and compared by value.

A cache is whatever a model returns and wants back (``DecodingModel`` in ``loop``): HF's
``Cache`` classes (``.layers[i].keys``), the legacy tuple of ``(keys, values)`` per layer,
a list of a port's own objects or modules holding ``k_cache``/``v_cache`` (or ``cache_k``,
``keys``, ``k``, ...), one object holding each layer's in two lists, or in two tensors with
the layers first, ``(L, B, S, nh, hd)``. Its layout is never assumed: the candidate's
tensor is read as the reference's by value, under every permutation of its axes, its heads
merged or repeated for grouped-query attention, and its sequence axis pre-allocated longer
than what is filled (a static cache): the layout with the smallest error over the filled
positions.

Example::

    >>> ref = torch.randn(1, 2, 5, 4)            # HF: (B, nkv, S, hd)
    >>> cand = torch.zeros(1, 16, 2, 4)          # a static cache: (B, max_len, nkv, hd)
    >>> cand[:, :5] = ref.transpose(1, 2)
    >>> compare_cached(ref, cand, Budget(1e-5, 1.3e-6)).layout
    'permute (0, 2, 1, 3), sequence axis pre-allocated to 16 (5 filled)'
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from introspect.diff.tolerance import Budget

# Attribute names a port's own cache objects use for their keys and values.
_PAIRS = (("keys", "values"), ("key_cache", "value_cache"), ("k_cache", "v_cache"),
          ("cache_k", "cache_v"), ("key", "value"), ("k", "v"))
_MAX_DEPTH = 4


def cache_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The (keys, values) of each layer a cache holds, in layer order; None when unreadable."""
    return _layers(cache, 0)


def _layers(cache: Any, depth: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    if cache is None or depth > _MAX_DEPTH:
        return None
    layers = getattr(cache, "layers", None)  # HF Cache (transformers >= 4.56)
    if isinstance(layers, Sequence) and layers:
        pairs = [_pair(layer) for layer in layers]
        return [p for p in pairs if p is not None] if all(p is not None for p in pairs) \
            else None
    own = _pair(cache)
    if own is not None and depth == 0 and own[0].dim() == 5 and own[0].shape[0] > 1 \
            and own[0].shape[0] == own[1].shape[0]:
        # the whole cache one pair of tensors with a layer axis first ((L, B, S, nh, hd)
        # pre-allocated): each layer's pair is a slice of it
        return [(own[0][i], own[1][i]) for i in range(own[0].shape[0])]
    if own is not None:  # one layer's pair, or an object holding one
        return [own]
    listed = _listed_pairs(cache)
    if listed is not None:  # one object holding every layer's keys in a list
        return listed
    items: Any = None
    if isinstance(cache, (tuple, list)):
        items = cache
    elif isinstance(cache, torch.nn.Module):
        children = list(cache.children())
        items = children[0] if len(children) == 1 and isinstance(
            children[0], torch.nn.ModuleList) else children
    if not items:
        return None
    found: list[tuple[torch.Tensor, torch.Tensor]] = []
    for item in items:
        pair = _pair(item)
        if pair is not None:
            found.append(pair)
            continue
        inner = _layers(item, depth + 1)
        if inner is None:
            return None
        found += inner
    return found or None


def _listed_pairs(item: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every layer's (keys, values) where one object holds them as two lists of tensors
    (``self.k_cache = [torch.zeros(...) for _ in range(layers)]``, a static cache)."""
    for keys, values in _named_pairs(item):
        if isinstance(keys, (tuple, list)) and isinstance(values, (tuple, list)) \
                and len(keys) == len(values) and keys \
                and all(isinstance(t, torch.Tensor) for t in (*keys, *values)):
            return list(zip(keys, values, strict=True))
    return None


def _named_pairs(item: Any) -> Iterator[tuple[Any, Any]]:
    """What ``item`` holds under each pair of names ports give keys and values."""
    for keys_name, values_name in _PAIRS:
        yield getattr(item, keys_name, None), getattr(item, values_name, None)


def _pair(item: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A layer's (keys, values): a pair of tensors (beside other fields: a tuple
    ``(k, v, length)``), or an object with k/v attributes."""
    if isinstance(item, (tuple, list)) and len(item) == 2 \
            and all(isinstance(t, torch.Tensor) for t in item):
        return item[0], item[1]
    if isinstance(item, (tuple, list)) and len(item) == 3 \
            and all(isinstance(t, torch.Tensor) for t in item[:2]) \
            and not isinstance(item[2], torch.Tensor) and item[0].shape == item[1].shape:
        return item[0], item[1]  # (beside its length)
    for keys, values in _named_pairs(item):
        if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor):
            return keys, values
    return None


@dataclass(frozen=True)
class CachedComparison:
    """How a candidate's cached tensor reads as the reference's."""

    layout: str  # "" when no layout fits
    max_abs_err: float | None  # over the filled positions
    passed: bool
    allocated: int  # the candidate's length along its sequence axis
    candidate_filled: torch.Tensor | None  # the candidate's filled part, reference layout
    tail: torch.Tensor | None  # the candidate's pre-allocated positions past the filled ones


def sequence_axis(reference: torch.Tensor, filled: int) -> int | None:
    """The reference's axis that holds ``filled`` positions (HF's -2 preferred)."""
    axes = [d for d in range(reference.dim()) if reference.shape[d] == filled]
    if not axes:
        return None
    return reference.dim() - 2 if reference.dim() - 2 in axes else axes[-1]


def compare_cached(reference: torch.Tensor, candidate: torch.Tensor, budget: Budget,
                   filled: int | None = None) -> CachedComparison:
    """Read ``candidate`` as ``reference`` by value, whatever its layout; measure the error.

    Args:
        reference: the reference's cached keys or values of one layer.
        candidate: the candidate's, in any layout (see the module's docstring).
        budget: the error budget (the two caches' dtype).
        filled: positions the reference holds (default: its size along axis -2).
    """
    filled = reference.shape[-2] if filled is None else filled
    axis = sequence_axis(reference, filled)
    if axis is None:
        return CachedComparison("", None, False, 0, None, None)
    best: tuple[float, str, torch.Tensor, torch.Tensor, torch.Tensor | None, int] | None = None
    order = [0, axis, *[d for d in range(1, reference.dim()) if d != axis]]
    for name, view in _reference_views(reference, axis, candidate):
        for perm in itertools.permutations(range(candidate.dim())):
            shape = [candidate.shape[p] for p in perm]
            if len(shape) != view.dim() or shape[1] < filled or any(
                    a != b for d, (a, b) in enumerate(zip(shape, view.shape, strict=True))
                    if d != 1):
                continue
            permuted = candidate.permute(perm)
            part = permuted[:, :filled].to(view.dtype)
            error = float((part - view).abs().max()) if part.numel() else 0.0
            if best is None or error < best[0]:
                tail = permuted[:, filled:] if shape[1] > filled else None
                if not name:  # the candidate's axes in the reference's own order
                    perm = tuple(perm[order.index(d)] for d in range(len(perm)))
                    where = [f"permute {perm}"] if perm != tuple(range(len(perm))) else []
                else:
                    where = [f"permute {tuple(perm)} to (batch, sequence, ...)", name]
                if shape[1] > filled:
                    where.append(f"sequence axis pre-allocated to {shape[1]} ({filled} filled)")
                best = (error, ", ".join(where) or "same layout", part, view, tail, shape[1])
    if best is None:
        return CachedComparison("", None, False, 0, None, None)
    error, layout, part, view, tail, allocated = best
    # an error within atol is within budget everywhere (a NaN makes the error NaN: read)
    within = error <= budget.atol or bool(
        ((part - view).abs() <= budget.atol + budget.rtol * view.abs()).all())
    return CachedComparison(layout, error, within, allocated, part, tail)


def _reference_views(reference: torch.Tensor, axis: int,
                     candidate: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The reference with its sequence axis at 1; its heads merged, or repeated (GQA)."""
    order = [0, axis, *[d for d in range(1, reference.dim()) if d != axis]]
    base = reference.permute(order)  # (B, S, nkv, hd) for HF's (B, nkv, S, hd)
    views = [("", base)]
    if base.dim() == 4:
        views.append(("heads merged", base.reshape(*base.shape[:2], -1)))
        heads = base.shape[2]
        for times in sorted({s // heads for s in candidate.shape
                             if s > heads and s % heads == 0}):
            views.append((f"key/value heads repeated x{times}",
                          repeated_heads(base, times)))
    return views


def repeated_heads(reference: torch.Tensor, times: int, *, tiled: bool = False) -> torch.Tensor:
    """(B, S, nkv, hd) -> (B, S, nkv * times, hd): each head repeated (HF's repeat_kv), or
    the whole set tiled (0, 1, 0, 1: the classic grouped-query port bug)."""
    if tiled:
        return reference.repeat(1, 1, times, 1)
    return reference.repeat_interleave(times, dim=2)


def shape_text(tensor: torch.Tensor | None) -> str:
    return "" if tensor is None else f"({', '.join(str(s) for s in tensor.shape)})"


__all__ = ["CachedComparison", "cache_layers", "compare_cached", "repeated_heads",
           "sequence_axis", "shape_text"]
