"""Copies of a model in another dtype, made once, and only where memory can hold them.

``--noise-budget``, ``--candidate-dtype`` and the float64 gradients of ``--backward`` each
need the reference in another dtype. ``copy.deepcopy(model).to(dtype)`` holds the model
three times on the way (the original, the deep copy in the original dtype, the cast),
and a 13 GB model killed for memory dies with no message. ``cast_copy`` deep-copies the
modules with each tensor cast straight to the new dtype (one new copy, nothing in
between), hands back the model itself when it is in that dtype already, and refuses,
with the sizes, a copy larger than the memory available.

Example::

    >>> exact = cast_copy(reference, torch.float64, what="--noise-budget")
    >>> rounded = cast_copy(reference, torch.bfloat16, what="--noise-budget")  # may be reference
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

from introspect.errors import InputError

# A copy may take this share of the memory available now (the rest: activations, torch).
COPY_SHARE = 0.8


def cast_copy(model: torch.nn.Module, dtype: torch.dtype, *, what: str = "a copy",
              memory: int | None = None, always: bool = False) -> torch.nn.Module:
    """``model`` with its floating tensors in ``dtype``: a copy, or ``model`` when they are.

    Non-floating tensors (ids, masks) are copied as they are. The copy is in eval mode
    when the model is; hooks and attributes are deep-copied as ``copy.deepcopy`` does.
    ``always``: a copy even when the model is in ``dtype`` already (a second model).

    Raises:
        InputError: the copy would take more than ``COPY_SHARE`` of the memory available
            (``what`` names what needs it).
    """
    tensors = _unique_tensors(model)
    if not always and all(t.dtype == dtype for t in tensors.values() if t.is_floating_point()):
        return model
    needed = sum(t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size())
                 for t in tensors.values())
    if memory is None:
        from introspect.models.validate import available_memory

        memory = available_memory()
    if needed > COPY_SHARE * memory:
        raise InputError(
            f"{what} needs the model in {str(dtype).removeprefix('torch.')}: a copy of "
            f"{needed / 2**30:.1f} GiB, more than the {COPY_SHARE * memory / 2**30:.1f} GiB "
            f"this machine can give it ({COPY_SHARE:.0%} of {memory / 2**30:.1f} GiB "
            "available); leave it out for a model this size")
    memo: dict[int, Any] = {}
    for tensor in tensors.values():  # deepcopy takes these instead of copying the originals
        memo[id(tensor)] = _cast(tensor, dtype)
    return copy.deepcopy(model, memo)


def _unique_tensors(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Every parameter and buffer once (tied weights are one tensor)."""
    return {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        data = tensor.detach().to(dtype, copy=True) if tensor.is_floating_point() \
            else tensor.detach().clone()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data


__all__ = ["COPY_SHARE", "cast_copy"]
