"""Leaf modules whose weights were swapped in for the call: ``torch.func.functional_call``.

A leaf module (a ``Linear``, a ``LayerNorm``) is one node of a recording, and its weights
are read from the module afterwards: where the forward ran it on weights handed in for
the call (``functional_call(skeleton, weights, ...)``, a port holding its weights as
buffers and a randomly initialised skeleton), the module holds its own again once the
call returned, and the recording would read and replay the skeleton's. Each leaf call's
weights are noted as it ends (``noted``); where every call of a module ran on the same
tensors and the module holds others now, the recording's graph is built on a shallow copy
of it holding those (``as_called``): what the call computed with."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping

import torch

Weights = dict[str, torch.Tensor]


def noted(module: torch.nn.Module) -> Weights | None:
    """The tensors ``module`` holds as its own parameters and buffers now; None where a
    module inside it holds some (only a module's own are copied)."""
    if any(True for child in module.children()
           for _ in (*child.parameters(), *child.buffers())):
        return None
    return {name: t for name, t in (*module._parameters.items(), *module._buffers.items())
            if t is not None}


@contextlib.contextmanager
def as_called(model: torch.nn.Module, calls: Mapping[str, list[Weights | None]],
              ) -> Iterator[None]:
    """``model``'s leaf modules replaced, meanwhile, by copies holding the weights their
    calls ran on, where those are not what they hold now and were the same in every call
    (``calls``: each leaf path's noted weights, call by call)."""
    replaced: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    try:
        for path, noted_calls in calls.items():
            module = model.get_submodule(path)
            first = noted_calls[0]
            if first is None or any(not _same(first, other) for other in noted_calls[1:]) \
                    or _same(first, noted(module) or {}):
                continue
            clone = copy.copy(module)
            clone._parameters = {n: t for n, t in first.items()  # type: ignore[misc]
                                 if n in module._parameters}  # (tensors, as handed in)
            clone._buffers = {n: t for n, t in first.items() if n in module._buffers}
            parent_path, _, name = path.rpartition(".")
            parent = model.get_submodule(parent_path)
            replaced.append((parent, name, module))
            parent._modules[name] = clone
        yield
    finally:
        for parent, name, module in replaced:
            parent._modules[name] = module


def _same(a: Weights | None, b: Weights | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() \
        and all(a[n] is b[n] for n in a)


__all__ = ["Weights", "as_called", "noted"]
