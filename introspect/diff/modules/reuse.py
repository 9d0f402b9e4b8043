"""A module's run on the reference's inputs, read from its ancestor's.

Module evidence runs a candidate module again on the reference's inputs to it (``local``);
its submodules run inside that run. Where a submodule's call there took exactly what its
own run would be given, that call IS its own run: its output is used, and the submodule is
not run again (a port that is exact up to a fault early on: every module after the fault
sees inputs of its own, so each would be run again; most are run inside an ancestor's run).

Exactly what its own run would be given (``local._rerun``) means: each paired input bit
for bit the reference's value, cast to its call's dtype and device, laid out as the copy
that run makes; every other tensor argument bit for bit its own call's, laid out alike;
every other argument of a plain type (None, bool, int, float, str, dtype, device) and equal;
tuples, lists and dicts of the same shape; the same grad mode and the same ambient state
(autocast, default dtype, sdpa backends, matmul precision, threads: ``_ambient``). Then
the module computes what its own run would, on the same values (a module is a function
of its arguments, its weights and that state, as the run itself assumes). Not reused:

- a call that edits a tensor argument in place (its version moves during the call: two
  arguments that alias, as copies never do, would compute otherwise), or one whose keyword
  arguments hold a tensor (a global pre-hook is not given them: their versions before the
  call are unknown);
- an output edited after the call (``y += x`` in the parent: its version moved since);
- a module with a hook of its own, or with another global hook beside ours (a hook may
  change what the module is given or returns), a module in training mode (dropout), and
  any run of an ancestor that holds a compiled module (its code may differ with hooks on);
- anything but the exact run: the noise run (on rounded inputs) never feeds it.

Only the calls still to be judged are watched, and each output is held from its ancestor's
run until its own call is judged (parents are judged first, ``evidence``): then dropped. A
model's run holds every module's output at once: past ``hold_bytes`` held (the diff's
budget for values in memory, ``run.spill``), an output is not kept, and its module is run
on its own when its turn comes (time, not memory).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.nn.modules import module as nn_module

from introspect.diff.modules.arguments import output_at
from introspect.diff.modules.handovers import HandOvers
from introspect.diff.modules.pairing import ModulePair
from introspect.run.capture import wrapped

# Off: every module is run again on its own (tests compare the rows both ways).
REUSE = True

_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Reruns:
    """The outputs the exact runs of ancestors gave the calls still to be judged.

    Example::

        >>> reruns = Reruns(pairs)  # the pairs whose local error is still to be measured
        >>> seen = reruns.take(pair)  # before its own run: None, or its output seen
        >>> with reruns.watching(pair.call.module):  # its exact run feeds its submodules
        ...     returned = pair.call.module(*args, **kwargs)
    """

    def __init__(self, pending: Iterable[ModulePair], hold_bytes: int | None = None) -> None:
        self.hold_bytes = hold_bytes  # None: no limit
        self.held_bytes = 0
        self.waiting: dict[int, list[ModulePair]] = {}  # id(module) -> pairs not judged
        for pair in pending:
            if REUSE and not any(m.training for m in pair.call.module.modules()):
                self.waiting.setdefault(id(pair.call.module), []).append(pair)
        # id(call) -> (its output, the output's version, the ambient state it ran in)
        self.seen: dict[int, tuple[torch.Tensor, int, tuple[object, ...]]] = {}
        self.started: dict[tuple[int, int], list[_Start | None]] = {}
        self.ambient: tuple[object, ...] = ()
        # what the run hands the judged calls inside it (``handovers.HandOvers``), and
        # whether its outputs may be reused (never from a noise run)
        self.handing: HandOvers | None = None
        self.reusing = True

    def take(self, pair: ModulePair) -> torch.Tensor | None:
        """``pair``'s output seen in an ancestor's exact run, as it was then (None where
        none was, or it has been edited since); ``pair`` is watched no more."""
        _drop(self.waiting.get(id(pair.call.module), []), pair)
        seen = self.seen.pop(id(pair.call), None)
        if seen is None:
            return None
        output, version, ambient = seen
        self.held_bytes -= _nbytes(output)
        # (a run of its own would run in the state as it is now: an ancestor may have
        # changed it for good after the call)
        return output if _version(output) == version and _ambient() == ambient else None

    @contextlib.contextmanager
    def watching(self, module: torch.nn.Module, handing: HandOvers | None = None,
                 reuse: bool = True) -> Iterator[None]:
        """Around the exact run of ``module``: keep what the calls still to be judged
        return inside it, where they took exactly what their own runs would; and, with
        ``handing``, show it each call's arguments. ``reuse``
        False: a run on other values (the noise run), whose outputs are never kept."""
        reusing = reuse and any(self.waiting.values())
        handed = handing is not None and handing.expects()
        if not (reusing or handed) or any(
                getattr(m, "_orig_mod", None) is not None for m in module.modules()):
            yield
            return
        self.ambient = _ambient()
        self.handing, self.reusing = handing if handed else None, reusing
        pre = nn_module.register_module_forward_pre_hook(self._pre)
        post = nn_module.register_module_forward_hook(self._post, with_kwargs=True)
        try:
            yield
        finally:
            pre.remove()
            post.remove()
            # ``remove`` leaves the id in the with-kwargs table (PyTorch 2.x), as ``capture``
            nn_module._global_forward_hooks_with_kwargs.pop(post.id, None)
            self.started.clear()
            self.handing, self.reusing = None, True

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if torch.compiler.is_compiling():  # first: dynamo's code stays unchanged
            return
        if self.handing is not None:
            self.handing.saw(module, args)
        if not self.reusing or not self.waiting.get(id(module)):
            return  # (never refilled while watching: the post-hook of a call left out
            # here pops nothing)
        start = None
        if _alone(module):
            tensors = _tensors(args)
            versions = [_version(t) for t in tensors]
            if all(v >= 0 for v in versions):
                start = _Start(tensors, versions, torch.is_grad_enabled(), _ambient())
        self.started.setdefault((id(module), threading.get_ident()), []).append(start)

    def _post(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              returned: Any) -> None:
        if torch.compiler.is_compiling():
            return
        calls = self.waiting.get(id(module)) if self.reusing else None
        if not calls:
            return
        stack = self.started.get((id(module), threading.get_ident()))
        start = stack.pop() if stack else None
        if start is None or start.ambient != self.ambient or _tensors(kwargs) \
                or not _alone(module):
            return
        tensors = _tensors(args)  # the same tensors, none edited in place during the call
        if len(tensors) != len(start.tensors) or any(
                t is not s or _version(t) != v
                for t, s, v in zip(tensors, start.tensors, start.versions, strict=True)):
            return
        for pair in list(calls):
            if pair.call.grad == start.grad and _took_exactly(pair, args, kwargs):
                output = _output(pair, returned)
                if output is not None and self._room_for(output):
                    self.seen[id(pair.call)] = (output, _version(output), start.ambient)
                    self.held_bytes += _nbytes(output)
                    _drop(calls, pair)  # seen once is enough

    def _room_for(self, output: torch.Tensor) -> bool:
        return self.hold_bytes is None or self.held_bytes + _nbytes(output) <= self.hold_bytes


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _alone(module: torch.nn.Module) -> bool:
    """Our hooks the only ones around ``module``'s call: what they see is what its forward
    was given and returned (a hook of its own runs after ours, and may change either)."""
    return not (module._forward_pre_hooks or module._forward_hooks) \
        and len(nn_module._global_forward_pre_hooks) == 1 \
        and len(nn_module._global_forward_hooks) == 1


class _Start:
    """What a watched call was given, as its pre-hook saw it."""

    def __init__(self, tensors: list[torch.Tensor], versions: list[int], grad: bool,
                 ambient: tuple[object, ...]) -> None:
        self.tensors, self.versions, self.grad, self.ambient = tensors, versions, grad, ambient


def _drop(pairs: list[ModulePair], pair: ModulePair) -> None:
    pairs[:] = [p for p in pairs if p is not pair]  # (by identity: a pair holds tensors)


def _took_exactly(pair: ModulePair, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The call took what ``local._rerun`` gives ``pair``'s module on the reference's inputs."""
    paired = {m.path: m.boundary.value for m in pair.inputs}
    return _same(args, pair.call.args, "args", paired) \
        and _same(kwargs, pair.call.kwargs, "kwargs", paired)


def _same(seen: Any, own: Any, path: str, paired: dict[str, torch.Tensor]) -> bool:
    if isinstance(own, torch.Tensor):
        if path in paired:  # the reference's value, cast as the run casts it
            reference = paired[path]
            return reference.shape == own.shape and _took(seen, reference, own)
        return _took(seen, own, own)
    if type(own) in (tuple, list):
        return type(seen) is type(own) and len(seen) == len(own) and all(
            _same(seen[i], o, f"{path}.{i}", paired) for i, o in enumerate(own))
    if type(own) is dict:
        return type(seen) is dict and list(seen) == list(own) and all(
            _same(seen[k], own[k], f"{path}.{k}", paired) for k in own)
    if type(own) not in _PLAIN or type(seen) is not type(own):
        return False
    if isinstance(own, float):  # -0.0 == 0.0, NaN != NaN: neither is reused
        return own == seen and math.copysign(1.0, own) == math.copysign(1.0, seen)
    return bool(own == seen)


def _took(seen: Any, value: torch.Tensor, like: torch.Tensor) -> bool:
    """``seen`` is ``value`` as the run's copy of it holds it: ``like``'s dtype and device,
    ``value``'s layout (a copy keeps a dense layout), bit for bit."""
    if type(seen) is not torch.Tensor or not all(map(_plain_tensor, (seen, value, like))):
        return False
    if seen.dtype != like.dtype or seen.device != like.device or seen.shape != like.shape \
            or seen.stride() != torch.empty_like(value, device="meta").stride():
        return False
    return _bits(seen, value.detach().to(like.dtype).to(like.device))


def _plain_tensor(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_meta and not wrapped(t)


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaN's payload, -0.0 apart from 0.0)."""
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        bits = _BITS.get(a.element_size())
        if bits is None:
            return False
        a, b = a.view(bits), b.view(bits)
    return bool(torch.equal(a, b))


def _output(pair: ModulePair, returned: Any) -> torch.Tensor | None:
    """The output ``local._rerun`` reads from ``returned``; None where it would not read
    one (it says why when run itself)."""
    try:
        out = output_at(returned, pair.output.path)
    except Exception:  # noqa: BLE001  its own run raises it, as before
        return None
    if not isinstance(out, torch.Tensor) or _version(out) < 0 \
            or tuple(out.shape) != tuple(pair.output.boundary.value.shape):
        return None
    return out.detach()


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value``'s tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor: no counter
        return -1


def _ambient() -> tuple[object, ...]:
    """The state besides its arguments that a module's output hangs on, which a parent may
    change around a child's call: inference mode, the default dtype, autocast, the sdpa
    backends, matmul precision, determinism, threads, the fast paths."""
    cuda = torch.backends.cuda
    return (torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
            torch.is_autocast_cache_enabled(), torch.get_float32_matmul_precision(),
            cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.get_num_threads(),
            torch.backends.mha.get_fastpath_enabled(), torch.backends.mkldnn.enabled)


__all__ = ["REUSE", "Reruns"]
