"""A module call's arguments and returned value, by the paths of its leaves
(``capture.Leaf.path``: "args.0", "kwargs.mask", "output.0.1").

Example::

    >>> args, kwargs = [torch.zeros(2), (torch.ones(1), 3)], {"mask": None}
    >>> value_at(args, kwargs, "args.1.0")
    tensor([1.])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def mapped(value: Any, at_leaf: Callable[[Any, str], Any], path: str = "") -> Any:
    """``value`` rebuilt with each leaf replaced by ``at_leaf(leaf, its path)``: tuples (a
    named tuple is a leaf), lists and dicts are walked, paths as ``capture.Leaf.path``'s
    ("args.0.1", "kwargs.mask") from ``path``."""
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(mapped(v, at_leaf, f"{path}.{i}") for i, v in enumerate(value))
    if isinstance(value, list):
        return [mapped(v, at_leaf, f"{path}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: mapped(v, at_leaf, f"{path}.{k}") for k, v in value.items()}
    return at_leaf(value, path)


def copied(value: Any) -> Any:
    """``value`` with each tensor in it (in tuples, lists and dicts) a copy."""
    return mapped(value, lambda leaf, _: leaf.clone() if isinstance(leaf, torch.Tensor)
                  and not leaf.is_meta else leaf)


def as_argument(value: torch.Tensor, argument: torch.Tensor) -> torch.Tensor:
    """A copy of ``value`` (the reference's, paired with ``argument``) as the call held
    ``argument``: its dtype, device and shape."""
    return value.detach().to(argument.dtype).to(argument.device, copy=True) \
        .reshape(argument.shape)


def _steps(path: str) -> list[str]:
    return path.split(".")


def value_at(args: list[Any], kwargs: dict[str, Any], path: str) -> Any:
    """The argument at ``path`` ("args.0.1", "kwargs.mask")."""
    head, *rest = _steps(path)
    value: Any = args if head == "args" else kwargs
    for step in rest:
        value = value[int(step)] if isinstance(value, (list, tuple)) else value[step]
    return value


def put(args: list[Any], kwargs: dict[str, Any], path: str, new: Any) -> None:
    """Put ``new`` at ``path``, copying the tuples and dicts on the way (the call's own
    arguments stay as they were)."""
    head, *rest = _steps(path)
    if head == "args":
        args[int(rest[0])] = _replaced(args[int(rest[0])], rest[1:], new)
    else:
        kwargs[rest[0]] = _replaced(kwargs[rest[0]], rest[1:], new)


def _replaced(container: Any, rest: list[str], new: Any) -> Any:
    if not rest:
        return new
    if isinstance(container, (list, tuple)):
        items = list(container)
        items[int(rest[0])] = _replaced(items[int(rest[0])], rest[1:], new)
        return type(container)(items) if isinstance(container, list) else tuple(items)
    copy = dict(container)
    copy[rest[0]] = _replaced(container[rest[0]], rest[1:], new)
    return copy


def output_at(returned: Any, path: str) -> Any:
    """The part of a module's returned value at ``path`` ("output.0"; a dict or a
    ``ModelOutput`` by key or by position)."""
    value = returned
    for step in _steps(path)[1:]:
        if isinstance(value, dict) or hasattr(value, "keys"):
            value = value[step] if step in value else list(value.values())[int(step)] \
                if step.isdigit() else value[step]
        elif hasattr(value, "to_tuple"):
            value = value.to_tuple()[int(step)]
        else:
            value = value[int(step)]
    return value


__all__ = ["as_argument", "copied", "mapped", "output_at", "put", "value_at"]
