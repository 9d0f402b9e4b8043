"""A value that is a view of another (its dimensions permuted, a row or a block of it, a
unit dimension added): which value it views, and the same view of a value computed anew.

Module evidence pairs a port's values with the reference's laid out as the port lays
them (``pairing._views``: a port that runs sequence-first takes the reference's hidden
states transposed). Those views share the memory of the reference's own values, so the
call that computed one is the call that computed the value it views, and a float64 run
of that call (``precise``) gives the view's float64 values by the same strides."""

from __future__ import annotations

import torch


def views_into(view: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether ``view`` addresses only memory of ``source``, a dense (contiguous) tensor
    of the same dtype: each of its elements is one of ``source``'s."""
    if view.dtype != source.dtype or not source.is_contiguous() \
            or view.untyped_storage().data_ptr() != source.untyped_storage().data_ptr():
        return False
    if view.numel() == 0:
        return False
    first = view.storage_offset()
    last = first + sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(),
                                                                   strict=True)
                       if stride > 0)
    lowest = first + sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(),
                                                                     strict=True)
                         if stride < 0)
    start = source.storage_offset()
    return start <= lowest and last < start + source.numel()


def as_viewed(value: torch.Tensor, source: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``value`` (``source``'s shape, computed anew: in float64) viewed as ``view`` views
    ``source`` (``views_into``)."""
    laid = value.contiguous().reshape(source.shape)
    return laid.as_strided(tuple(view.shape), tuple(view.stride()),
                           laid.storage_offset() + view.storage_offset()
                           - source.storage_offset())


__all__ = ["as_viewed", "views_into"]
