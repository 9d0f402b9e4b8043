"""Every output a model returns, by name, whatever produced it.

A port's output is whatever its forward returns: a HF ``ModelOutput``, a tuple, a dict, a
bare tensor, a NumPy array (a pooler whose ``tanh`` ran in NumPy), a list of them. Each
leaf becomes a CPU-independent, detached copy under a dotted name
(``last_hidden_state``, ``output_1``, ``past_key_values.0.1``), so that outputs made
outside torch are compared like any other and a later call cannot change them in place.
Objects that are neither (a cache object, a string) are left out: they carry no value to
compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_MAX_DEPTH = 4  # ModelOutput > tuple of layers > tuple of (key, value) > tensor


def flatten_outputs(outputs: Any) -> dict[str, torch.Tensor]:
    """The tensors (and arrays, and floats) ``outputs`` holds, by dotted name.

    Top-level names follow ``introspect.diff.eager.outputs_as_dict``: a mapping's keys, a
    tuple's ``output_<i>``, ``output`` for a single value.

    Example::

        >>> sorted(flatten_outputs((torch.ones(2), {"p": torch.zeros(1)})))
        ['output_0', 'output_1.p']
    """
    leaves: dict[str, torch.Tensor] = {}
    if isinstance(outputs, Mapping):
        items = [(str(k), v) for k, v in outputs.items()]
    elif isinstance(outputs, (tuple, list)):
        items = [(f"output_{i}", v) for i, v in enumerate(outputs)]
    else:
        items = [("output", outputs)]
    for name, value in items:
        _walk(value, name, leaves, 1)
    return leaves


def _walk(value: Any, name: str, leaves: dict[str, torch.Tensor], depth: int) -> None:
    tensor = as_tensor(value)
    if tensor is not None:
        leaves[name] = tensor
        return
    if depth >= _MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
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


__all__ = ["as_tensor", "flatten_outputs"]
