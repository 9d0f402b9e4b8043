"""Every output a model returns, by name, whatever produced it.

A port's output is whatever its forward returns: a HF ``ModelOutput``, a tuple, a dict, a
``@dataclass`` (its fields by name, as a dict's keys), a bare tensor, a NumPy array (a
pooler whose ``tanh`` ran in NumPy), a list of them. Each
leaf becomes a CPU-independent, detached copy under a dotted name
(``last_hidden_state``, ``output_1``, ``past_key_values.0.1``), so that outputs made
outside torch are compared like any other and a later call cannot change them in place.
Objects that are neither (a cache object, a string) are left out: they carry no value to
compare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

_MAX_DEPTH = 4  # ModelOutput > tuple of layers > tuple of (key, value) > tensor


def flatten_outputs(outputs: Any) -> dict[str, torch.Tensor]:
    """The tensors (and arrays, and floats) ``outputs`` holds, by dotted name.

    Top-level names follow ``introspect.diff.ops.eager.outputs_as_dict``: a mapping's keys, a
    tuple's ``output_<i>``, ``output`` for a single value.

    Example::

        >>> sorted(flatten_outputs((torch.ones(2), {"p": torch.zeros(1)})))
        ['output_0', 'output_1.p']
    """
    leaves: dict[str, torch.Tensor] = {}
    for name, value in output_items(outputs):
        _walk(value, name, leaves, 1)
    return leaves


def output_items(outputs: Any) -> list[tuple[str, Any]]:
    """A forward's top-level outputs by name: a mapping's keys, a dataclass's fields, a
    tuple's ``output_<i>``, ``output`` for a single value."""
    fields = _fields(outputs)
    if fields is not None:
        return fields
    if isinstance(outputs, (tuple, list)):
        return [(f"output_{i}", v) for i, v in enumerate(outputs)]
    return [("output", outputs)]


def _fields(value: Any) -> list[tuple[str, Any]] | None:
    """A mapping's items or a dataclass instance's fields (a HF ``ModelOutput`` is both: its
    items, which leave out the fields set to None); None for anything else."""
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    return None


def _walk(value: Any, name: str, leaves: dict[str, torch.Tensor], depth: int) -> None:
    tensor = as_tensor(value)
    if tensor is not None:
        leaves[name] = tensor
        return
    if depth >= _MAX_DEPTH:
        return
    fields = _fields(value)
    if fields is not None:
        for key, item in fields:
            _walk(item, f"{name}.{key}", leaves, depth + 1)
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _walk(item, f"{name}.{i}", leaves, depth + 1)


def as_tensor(value: Any) -> torch.Tensor | None:
    """A detached copy of a tensor, a NumPy array or a float; None for anything else."""
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.layout != torch.strided:
            value = value.to_padded_tensor(0.0) if value.is_nested else value.to_dense()
        return value.detach().to("cpu", copy=True)  # compared on the CPU, one at a time
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    numpy = _numpy_array(value)
    if numpy is not None:
        return numpy
    return None


def _numpy_array(value: Any) -> torch.Tensor | None:
    module = type(value).__module__
    if not module.startswith("numpy"):
        return None
    import numpy as np

    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiub":
        return None
    return torch.from_numpy(np.array(value, copy=True))


__all__ = ["as_tensor", "flatten_outputs", "output_items"]
