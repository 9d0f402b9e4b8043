"""Sizes read while tracing, used the ways ports use them: ``torch.ones(S, S)``, ``*x.shape``.

A traced size (``S = x.shape[1]``) is an fx Proxy, so the graph stays valid for every
sequence length. torch's factories take it inside a tuple (``torch.ones((S, S))``) but
not as separate arguments: their argument parser rejects a Proxy there before fx can
record the call. People write ``torch.ones(S, S)`` and ``torch.zeros(B, S)`` all the
time, so while a trace runs those calls are passed on in the tuple form, which records
the same call. Calls without a traced size are passed on untouched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx

# Factories whose size may be given as separate arguments (``*size``).
FACTORIES = ("ones", "zeros", "empty", "rand", "randn")


@contextlib.contextmanager
def factories_take_traced_sizes() -> Iterator[None]:
    """Within: ``torch.ones(S, S)`` with traced sizes is recorded as ``torch.ones((S, S))``."""
    originals = {name: getattr(torch, name) for name in FACTORIES}
    for name, original in originals.items():
        setattr(torch, name, _sizes_as_tuple(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch, name, original)


def _sizes_as_tuple(factory: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def called(*size: Any, **kwargs: Any) -> Any:
        if len(size) > 1 and any(isinstance(s, torch.fx.Proxy) for s in size):
            return factory(size, **kwargs)
        return factory(*size, **kwargs)

    return called


__all__ = ["FACTORIES", "factories_take_traced_sizes"]
