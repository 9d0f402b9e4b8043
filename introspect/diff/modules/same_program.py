"""Whether a module's float64 run is its float32 run in more precision: the same ops, on
the same values, in the same order.

A module run again in float64 (``precise``) vouches for what its float32 run computed only
where it runs the same program. A port may branch on a value's dtype (a key scaled by
1 + 1e-5 where it is float32 only), pick a constant by it, or call other ops; its float64
run is then the reference's exactly while its float32 run is not, and a difference there
would pass as one that cancels (``cancelled``). So both runs are logged op by op, below
autograd (``_OpLog``, a dispatch mode on top of any other), and held to each other: each
op's name; each tensor it takes, by where it came from (the run's own inputs and weights
by their place, a value an earlier op returned by that op, any other by its values
rounded to float32); each other argument as it is, float32 and float64 being one dtype,
and a dtype's extreme or epsilon being one number, so that a mask filled with
``finfo(x.dtype).min`` reads alike in both runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from introspect.diff.modules.arguments import copied
from introspect.run.truth import keeping_nothing

_FLOATS = (torch.float32, torch.float64)
# a value rounded coarser than float32 in the float32 run: its float64 run takes the dtype
# asked for up to float64 (``precise._InFloat64``), so it cannot show what that rounding
# did (a key computed in bfloat16 is a fault of float32's run alone)
_COARSE = (torch.float16, torch.bfloat16)
# numbers a port reads off its values' dtype, which differ between the two runs by design
_DTYPE_NUMBERS = {
    value: f"finfo.{name}"
    for dtype in _FLOATS for name in ("min", "max", "eps", "tiny")
    for value in (getattr(torch.finfo(dtype), name),)
}


class _OpLog(TorchDispatchMode):
    """Each op a run dispatches, as ``(name, its arguments' signatures)``; the values it
    returns are kept (their ids stay theirs) and known by the op that made them."""

    def __init__(self, given: list[torch.Tensor]) -> None:
        super().__init__()
        self._given = {_storage(t): i for i, t in enumerate(given)}
        self._made: dict[int, tuple[int, int]] = {}  # id(value) -> (op, its place)
        self._kept: list[torch.Tensor] = []
        self.ops: list[tuple[str, Any]] = []
        self.coarse = ""  # the first op returning a value coarser than float32

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        with _disable_current_modes():  # (reading a constant runs ops: none the run's)
            signature = tree_map(self._signature, (args, kwargs))
        returned = func(*args, **kwargs)
        for place, value in enumerate(tree_flatten(returned)[0]):
            if isinstance(value, torch.Tensor):  # (an op writing in place: its value anew)
                self._made[id(value)] = (len(self.ops), place)
                self._kept.append(value)
                if value.dtype in _COARSE and not self.coarse:
                    self.coarse = str(func)
        self.ops.append((str(func), signature))
        return returned

    def _signature(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            made = self._made.get(id(value))
            if made is not None:
                return ("made", made)
            given = self._given.get(_storage(value))
            if given is not None:
                return ("given", given, tuple(value.shape))
            return ("constant", _rounded(value))
        if isinstance(value, torch.dtype):
            return "float" if value in _FLOATS else str(value)
        if isinstance(value, float):
            return _DTYPE_NUMBERS.get(value, value)
        if isinstance(value, (bool, int, str)) or value is None:
            return value
        return repr(value)


def _rounded(value: torch.Tensor) -> tuple[Any, ...]:
    """A tensor no op of the run made (a constant made in Python), by its values: float32
    and float64 both as float32, so one constant made at either default dtype reads alike."""
    data = value.detach()
    if data.is_floating_point():
        data = data.to(torch.float32)
    return str(data.dtype), tuple(data.shape), data.cpu().contiguous().view(-1).tolist()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


Runner = Callable[[Callable[[], Any], list[torch.Tensor]], Any]


def logged(module: torch.nn.Module, args: list[Any], kwargs: dict[str, Any],
           run: Runner) -> _OpLog | None:
    """The ops ``module`` dispatches called on copies of ``args``/``kwargs`` by ``run``
    (handed the call and the copies' tensors: it calls it in float32 or in float64);
    None where the run raises."""
    given_args, given_kwargs = copied(args), copied(kwargs)
    given = [t for t in tree_flatten((given_args, given_kwargs))[0]
             if isinstance(t, torch.Tensor)]
    log = _OpLog([*given, *module.parameters(), *module.buffers()])

    def call() -> Any:
        with log:
            return keeping_nothing(lambda: module(*given_args, **given_kwargs))

    try:
        run(call, given)
    except Exception:  # noqa: BLE001  a run that raises shows no program to compare
        return None
    return log


def same_program(module: torch.nn.Module, args: list[Any], kwargs: dict[str, Any],
                 grad: bool, in_float64: Runner) -> bool:
    """Whether ``module`` on ``args``/``kwargs`` dispatches the same ops on the same
    values in float32 (compiled code run as written, as in float64) as it does when
    ``in_float64`` runs it (``precise.run_in_float64`` around the call, given the
    tensors it is handed), and rounds nothing coarser than float32 in float32."""
    def in_float32(call: Callable[[], Any], given: list[torch.Tensor]) -> Any:
        with torch.set_grad_enabled(grad), torch.compiler.set_stance("force_eager"):
            return call()

    float32 = logged(module, args, kwargs, in_float32)
    if float32 is None or float32.coarse:
        return False
    float64 = logged(module, args, kwargs, in_float64)
    return float64 is not None and float32.ops == float64.ops


__all__ = ["Runner", "logged", "same_program"]
