"""Collectives the recorder can see: ``all_reduce`` and its kin as in-place torch calls.

``torch.distributed.all_reduce(x)`` changes ``x`` in place from C++, outside any torch
function, so a ``TorchFunctionMode`` (``introspect.diff.ops.eager``) never sees it: the
recorded graph would carry the partial sum on to the next op, and its replay would skip
the sum. Inside a rank, ``traced_collectives`` replaces the c10d collectives a
Megatron-style port calls with wrappers that, while a torch function mode is active, go
through ``handle_torch_function`` as in-place calls (``all_reduce_``, ...): the recorder
writes one node per collective, the tensor it changed points at that node from then on,
and a replay (every rank replaying in step) runs the collective again. With no mode
active the wrappers are the plain collectives.

DTensor's conversions (``from_local``, ``to_local``, ``redistribute``, ``full_tensor``) are
autograd Functions the mode does not see either: the local tensor ``ColwiseParallel``
hands on would be a constant of the graph, cut from the Linear that made it (its replay
would not recompute it). ``traced_collectives`` makes them visible the same way.

The wrappers are installed before the port's file is imported, so that
``from torch.distributed import all_reduce`` binds them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.overrides import handle_torch_function

# The names of the recorded nodes' targets: a join reads them to tell a sum after its
# all-reduce from a partial before it.
COLLECTIVE_NAMES = ("all_reduce_", "all_gather_", "all_gather_into_tensor_",
                    "reduce_scatter_tensor_", "broadcast_")
_ORIGINAL: dict[str, Any] = {}


def _mode_active() -> bool:
    return bool(torch._C._is_torch_function_mode_enabled()) \
        and torch.overrides._get_current_function_mode_stack() != []


def all_reduce_(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None
                ) -> torch.Tensor:
    """Sum (or ``op``) ``tensor`` over the ranks, in place, and return it."""
    if _mode_active():
        return handle_torch_function(all_reduce_, (tensor,), tensor, op, group)  # type: ignore[no-any-return]
    _ORIGINAL["all_reduce"](tensor, op=op, group=group)
    return tensor


def all_gather_(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None
                ) -> list[torch.Tensor]:
    """Fill ``tensor_list`` with every rank's ``tensor``; return the list."""
    if _mode_active():
        return handle_torch_function(all_gather_, (*tensor_list, tensor),  # type: ignore[no-any-return]
                                     tensor_list, tensor, group)
    _ORIGINAL["all_gather"](list(tensor_list), tensor, group=group)
    return list(tensor_list)


def all_gather_into_tensor_(output: torch.Tensor, tensor: torch.Tensor, group: Any = None
                            ) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0 into ``output``; return it."""
    if _mode_active():
        return handle_torch_function(all_gather_into_tensor_, (output, tensor),  # type: ignore[no-any-return]
                                     output, tensor, group)
    _ORIGINAL["all_gather_into_tensor"](output, tensor, group=group)
    return output


def reduce_scatter_tensor_(output: torch.Tensor, tensor: torch.Tensor,
                           op: Any = dist.ReduceOp.SUM, group: Any = None) -> torch.Tensor:
    """This rank's block of the sum of every rank's ``tensor``, into ``output``."""
    if _mode_active():
        return handle_torch_function(reduce_scatter_tensor_, (output, tensor),  # type: ignore[no-any-return]
                                     output, tensor, op, group)
    _ORIGINAL["reduce_scatter_tensor"](output, tensor, op=op, group=group)
    return output


def broadcast_(tensor: torch.Tensor, src: int = 0, group: Any = None) -> torch.Tensor:
    """``src``'s ``tensor`` on every rank, in place."""
    if _mode_active():
        return handle_torch_function(broadcast_, (tensor,), tensor, src, group)  # type: ignore[no-any-return]
    _ORIGINAL["broadcast"](tensor, src=src, group=group)
    return tensor


def _all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                async_op: bool = False) -> Any:
    if async_op or not _mode_active():
        return _ORIGINAL["all_reduce"](tensor, op=op, group=group, async_op=async_op)
    all_reduce_(tensor, op, group)
    return None


def _all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                async_op: bool = False) -> Any:
    if async_op or not _mode_active():
        return _ORIGINAL["all_gather"](tensor_list, tensor, group=group, async_op=async_op)
    all_gather_(tensor_list, tensor, group)
    return None


def _all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                            group: Any = None, async_op: bool = False) -> Any:
    if async_op or not _mode_active():
        return _ORIGINAL["all_gather_into_tensor"](output_tensor, input_tensor, group=group,
                                                   async_op=async_op)
    all_gather_into_tensor_(output_tensor, input_tensor, group)
    return None


def _reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor,
                           op: Any = dist.ReduceOp.SUM, group: Any = None,
                           async_op: bool = False) -> Any:
    if async_op or not _mode_active():
        return _ORIGINAL["reduce_scatter_tensor"](output, input, op=op, group=group,
                                                  async_op=async_op)
    reduce_scatter_tensor_(output, input, op, group)
    return None


def _broadcast(tensor: torch.Tensor, src: int | None = None, group: Any = None,
               async_op: bool = False, group_src: int | None = None) -> Any:
    if async_op or group_src is not None or src is None or not _mode_active():
        return _ORIGINAL["broadcast"](tensor, src=src, group=group, async_op=async_op,
                                      group_src=group_src)
    broadcast_(tensor, src, group)
    return None


_WRAPPERS = {"all_reduce": _all_reduce, "all_gather": _all_gather,
             "all_gather_into_tensor": _all_gather_into_tensor,
             "reduce_scatter_tensor": _reduce_scatter_tensor, "broadcast": _broadcast}


def _visible(name: str, original: Any) -> Any:
    """``original`` (a DTensor conversion) as a call the recorder writes as one node."""
    def conversion(*args: Any, **kwargs: Any) -> Any:
        if _mode_active():
            tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
            return handle_torch_function(conversion, tensors, *args, **kwargs)
        return original(*args, **kwargs)

    conversion.__name__ = conversion.__qualname__ = name
    return conversion


_DTENSOR_METHODS = ("to_local", "redistribute", "full_tensor")


@contextlib.contextmanager
def traced_collectives() -> Iterator[None]:
    """``torch.distributed``'s collectives and DTensor's conversions replaced by recordable
    ones, then put back."""
    from torch.distributed.tensor import DTensor

    for name in _WRAPPERS:
        _ORIGINAL.setdefault(name, getattr(distributed_c10d, name))
    methods = {name: vars(DTensor)[name] for name in (*_DTENSOR_METHODS, "from_local")}
    try:
        for name, wrapper in _WRAPPERS.items():
            setattr(dist, name, wrapper)
            setattr(distributed_c10d, name, wrapper)
        for name in _DTENSOR_METHODS:
            setattr(DTensor, name, _visible(name, methods[name]))
        DTensor.from_local = staticmethod(  # type: ignore[method-assign]
            _visible("from_local", methods["from_local"].__func__))
        yield
    finally:
        for name, original in _ORIGINAL.items():
            setattr(dist, name, original)
            setattr(distributed_c10d, name, original)
        for name, method in methods.items():
            setattr(DTensor, name, method)
