"""What each module saw in a plain call: its tensor inputs and outputs, taken by hooks that
do not change the path.

The truth runs (``introspect.run.truth``) call each model as its user does. Around those
calls, ``capture_calls`` registers *global* forward hooks
(``register_module_forward_pre_hook`` / ``register_module_forward_hook``): a per-module hook
switches PyTorch's fast paths off, a global one does not. Each hook asks
``torch.compiler.is_compiling()`` first and does nothing inside a compiled region, so
dynamo's code is unchanged and a ``torch.compile``d module (``OptimizedModule``) is seen at
its own boundary only; a scripted module runs its submodules in TorchScript, where no hook
fires. PyTorch runs a module's own forward hooks after the global ones, and one may return
another output (a port scaling a layer's output in a hook): such a module's call is taken
by a hook of ours registered on it after theirs, so its output is what its caller got.
A module called under ``torch.func.vmap`` sees wrapped tensors and is left out (the
module that called ``vmap`` is seen); one called in a worker thread is seen like any other,
marked with the thread.

The values are kept as detached references, not copies: a forward that later edits one in
place bumps its version counter, and such a value is dropped (``ModuleCall.inputs`` /
``outputs`` hold only values whose version did not move). Only the first call with autograd
on and the first under ``no_grad`` are kept (``inference_mode`` tensors have no versions).

Held, those references keep every module's values of a forward alive. A value equal bit for
bit to one kept already (the ``no_grad`` call's repeat of the autograd call's, or, with
``share``, a candidate's value equal to the reference's) is kept as that one tensor, in its
leaf and in the call's arguments alike, so the repeat's memory is freed when the model lets
go of it: a close port's calls cost about one forward's values, not four
(``benchmarks.diff_peak``).

Example::

    >>> with capture_calls(model) as calls:
    ...     model(**inputs)
    >>> [c.name for c in calls.calls][:2]
    ['embeddings.word_embeddings', 'embeddings.token_type_embeddings']
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from introspect.run.same_bytes import same_bytes
from introspect.run.spill import Holding, Spilled
from introspect.run.truth import AUTOGRAD, NO_GRAD, same_view
from introspect.spread import spread

_MAX_DEPTH = 4  # a tuple of a dict of a list of tensors, as ``run.outputs``


@dataclasses.dataclass
class Leaf:
    """One tensor of a module call: where it sits in the call, its value, its version."""

    path: str  # "args.0", "kwargs.mask", "output.0.1"
    held: torch.Tensor | Spilled  # detached, not copied; or, past the budget, on disk
    version: int
    tracked: bool = False  # autograd tracked it in the call (``requires_grad``)
    # d loss / d value in the user's own backward of that call (``capture_calls``'s
    # ``gradients``): an output's, where autograd reached it
    grad: torch.Tensor | None = None
    grad_version: int = -1
    # found equal to a value held apart and known free of NaN (``_Known.keep``: compared
    # element by element, where ``torch.equal`` is False wherever NaN is, or the same bytes
    # with a finite sum), so nothing need read it for one
    nan_free: bool = False

    @property
    def value(self) -> torch.Tensor:
        """The value, read back where it was spilled (``run.spill``)."""
        held = self.held
        return held.load() if isinstance(held, Spilled) else held

    def grad_edited(self) -> bool:
        """A gradient came, and a later backward edited it in place (one may edit the
        gradient it is handed): it no longer says what this output was handed."""
        return self.grad is not None and self.grad._version != self.grad_version

    def held_grad(self) -> torch.Tensor | None:
        """``grad`` where the backward left it as it came; None where none came or it was
        edited."""
        return None if self.grad_edited() else self.grad

    def unchanged(self) -> bool:
        """Not edited in place since the hook saw it (views share the counter). A spilled
        value is a copy the hook took: what the module took or returned."""
        if isinstance(self.held, Spilled):
            return True
        try:
            return self.value._version == self.version
        except RuntimeError:  # an inference tensor: no counter
            return False


@dataclasses.dataclass
class ModuleCall:
    """One call of one module in a plain call of the model."""

    name: str  # the module's path in the model ("" for the model itself)
    module: torch.nn.Module
    mode: str  # the plain call it belongs to: AUTOGRAD or NO_GRAD
    grad: bool  # autograd on in the thread that called the module
    held_args: tuple[Any, ...]  # as called, a spilled leaf's value as its ``Spilled``
    held_kwargs: dict[str, Any]
    inputs: list[Leaf]
    outputs: list[Leaf]
    order: int  # in the order calls finished
    thread: bool  # called in another thread than the model's own call
    edited_inputs: bool = False  # the module edited an input in place
    started: int = -1  # in the order calls started (-1: not seen starting)
    # the state its output hangs on that a caller sets around it (``call_context``)
    context: tuple[object, ...] = ()
    # called under ``vmap``: the positional arguments batched (their batch dim first, as
    # its outputs'); a run of it alone maps it over them again (``modules.local``)
    batched: frozenset[int] | None = None

    @property
    def args(self) -> tuple[Any, ...]:
        """The positional arguments, each spilled value read back."""
        return _read_back(self.held_args)

    @property
    def kwargs(self) -> dict[str, Any]:
        return _read_back(self.held_kwargs)


@dataclasses.dataclass
class Calls:
    """The module calls of one model's plain calls, and what the hooks could not see."""

    model: torch.nn.Module
    calls: list[ModuleCall] = dataclasses.field(default_factory=list)
    vmapped: set[str] = dataclasses.field(default_factory=set)  # modules run under vmap
    # modules called with autograd off inside the call with it on, in the model's thread
    # (``torch.no_grad()``, a reentrant checkpoint's first run): kept past ``calls``
    # being let go, for a backward FAIL's hint (``backward.cut``)
    grad_off: set[str] = dataclasses.field(default_factory=set)
    # what the hooks hold in memory and where the rest went (one for a diff's two models)
    holding: Holding = dataclasses.field(default_factory=lambda: Holding(None))

    def of_mode(self, mode: str) -> list[ModuleCall]:
        return [c for c in self.calls if c.mode == mode]


class _Known:
    """Values kept already, found again by a probe of a few elements, then bit for bit;
    each held, or past the ``holding``'s budget spilled (``run.spill``)."""

    _PROBE = 16

    def __init__(self, holding: Holding | None = None) -> None:
        self.holding = holding if holding is not None else Holding(None)
        self.by_key: dict[tuple[object, ...], list[torch.Tensor | Spilled]] = {}
        # each kept value by the memory it views: a module's input is most often the
        # output of the one before, the same view found without reading its elements
        # (a spilled one's memory is not held, so it is compared before it is taken)
        self.by_view: dict[tuple[object, ...], torch.Tensor | Spilled] = {}

    def add(self, leaves: list[Leaf]) -> None:
        for leaf in leaves:
            if isinstance(leaf.held, Spilled):  # (not read back: keyed by its probe)
                kept = self.by_key.setdefault(self._key(leaf.held), [])
                if not any(k is leaf.held for k in kept):
                    kept.append(leaf.held)
            elif leaf.unchanged():
                self.keep(leaf.value)

    def keep(self, value: torch.Tensor) -> tuple[torch.Tensor | Spilled, bool]:
        """The kept value laid out as ``value`` and equal to it bit for bit; ``value``
        itself, kept from now on (held, or spilled), where there is none. The flag: the two
        are known free of NaN (compared element by element, or the same bytes with a
        finite sum); a view of held memory is not read."""
        self.holding.tick()
        view = _view_of(value)
        seen = self.by_view.get(view)
        if isinstance(seen, torch.Tensor) and (seen is value or same_view(seen, value)):
            return seen, False
        if isinstance(seen, Spilled) and same_bytes(seen.load(), value):
            return seen, _nan_free(value)
        key = self._key(value)
        kept = self.by_key.setdefault(key, [])
        for known in kept:  # (a view of held memory was found above: every held value
            # is under its view)
            held = known.load() if isinstance(known, Spilled) else known
            if value.numel() >= _BY_BYTES_FROM and same_bytes(held, value):
                return known, _nan_free(value)
            if torch.equal(held, value):  # (another layout, or -0.0 for 0.0)
                return known, True
        stored = self.holding.store(value, key[-1])  # type: ignore[arg-type]
        kept.append(stored)
        if isinstance(stored, Spilled) or view not in self.by_view:
            self.by_view[view] = stored  # (a spilled one's address may be reused)
        return stored, False

    def _key(self, t: torch.Tensor | Spilled) -> tuple[object, ...]:
        """Shape, strides, dtype, device and probe (a spilled value's, read before it was
        let go: the same key as the value it was)."""
        if isinstance(t, Spilled):
            return (t.shape, t.stride, t.dtype, torch.device("cpu"), t.probe)
        return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device, probe(t, self._PROBE))


# From this many elements, a repeat is compared by its bytes (``run.same_bytes``: memcmp,
# at the memory's speed) before ``torch.equal``, which reads each pair of elements as
# numbers: at BERT-base 8 x 128 a hidden state took 0.5 ms that way against 0.1 ms, and
# the hooks compare about a thousand such values a PASS. Below it, the call costs more
# than it saves.
_BY_BYTES_FROM = 1 << 16


def _nan_free(value: torch.Tensor) -> bool:
    """No NaN in ``value``, where that is cheap to know: its sum is finite (a NaN or an
    infinity anywhere makes it not; a sum that overflows says False, not knowing)."""
    total = value.sum(dtype=torch.float32) if value.element_size() < 4 else value.sum()
    return bool(torch.isfinite(total))


def _view_of(t: torch.Tensor) -> tuple[object, ...]:
    """Where ``t``'s elements lie: two tensors alike here are ``same_view`` (a kept value
    holds its memory, so no other memory takes its address while it is kept)."""
    try:
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                tuple(t.stride()), t.dtype, t.device)
    except (RuntimeError, NotImplementedError):  # no storage to ask (as ``same_view``)
        return (id(t),)


class _Hooks:
    def __init__(self, model: torch.nn.Module, found: Calls,
                 share: Calls | None = None, gradients: bool = False) -> None:
        self.names = {id(m): name for name, m in model.named_modules()}
        self.root = id(model)
        self.found = found
        self.known = _Known(found.holding)
        # the gradients the other model's outputs were handed, by the value they hold:
        # one of this model's, equal to it bit for bit, is kept as that one (memory)
        self.their_grads: dict[int, torch.Tensor] = {}
        for call in share.calls if share is not None else ():
            self.known.add(call.inputs + call.outputs)
            for leaf in call.outputs:
                held = leaf.held_grad()
                if held is not None:
                    self.their_grads.setdefault(id(leaf.value), held)
        self.lock = threading.Lock()
        self.mode: str | None = None  # the plain call being kept, if any
        self.kept: set[str] = set()
        self.thread = 0
        self.pending: dict[tuple[int, int], list[tuple[list[Leaf], int]]] = {}
        self.order = 0
        self.begun = 0  # calls started (``ModuleCall.started``)
        self.gradients = gradients
        # modules with forward hooks of their own: those run after every global hook and
        # may return another output, so such a module's call is taken by a hook of ours
        # registered on it after theirs (``late``), not by the global one
        self.late: set[int] = set()

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():  # first: dynamo's code stays unchanged
            return
        key = id(module)
        if key == self.root:
            self._start()
        if self.mode is None or key not in self.names:
            return
        leaves = _leaves(args, "args")
        with self.lock:
            self.begun += 1
            self.pending.setdefault((key, threading.get_ident()), []).append((leaves,
                                                                               self.begun))

    def post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any,
             late: bool = False) -> None:
        if torch.compiler.is_compiling():
            return
        key = id(module)
        if key in self.late and not late:
            return  # (taken by its own hook, after the module's hooks: what it returned)
        name = self.names.get(key)
        if self.mode is None or name is None:
            return
        with self.lock:
            stack = self.pending.get((key, threading.get_ident()))
            before, started = stack.pop() if stack else (None, -1)
        inputs = _leaves(args, "args") + _leaves(kwargs, "kwargs")
        tracked: dict[str, torch.Tensor] | None = \
            {} if self.gradients and self.mode == AUTOGRAD else None
        outputs = _leaves(output, "output", tracked=tracked)
        batched: frozenset[int] | None = None
        if any(wrapped(leaf.value) for leaf in inputs + outputs):
            unbatched = unbatch_call(args, kwargs, output)
            if unbatched is None:
                self.found.vmapped.add(name)  # under vmap: its caller is the boundary
                if key == self.root:
                    self.mode = None
                return
            args, kwargs, output, batched = unbatched  # the whole batch, as one call
            inputs = _leaves(args, "args") + _leaves(kwargs, "kwargs")
            outputs = _leaves(output, "output")
            before = None  # (the versions seen were the batched tensors')
        edited = before is not None and any(
            a.version != b.version for a, b in zip(before, inputs, strict=False))
        with self.lock:
            if not edited:
                inputs = self._shared(inputs)
            outputs = self._shared(outputs)
            for leaf in outputs:
                # the gradient of the value as the module returned it (a hook registered
                # before an in-place op gets the value's, not the edited tensor's)
                if tracked and leaf.path in tracked:
                    _hook_first(tracked[leaf.path], functools.partial(self.keep_grad, leaf))
            swaps = {leaf.path: leaf.held for leaf in inputs}
            if self.mode == AUTOGRAD and not torch.is_grad_enabled() \
                    and threading.get_ident() == self.thread:
                self.found.grad_off.add(name)
            self.order += 1
            self.found.calls.append(ModuleCall(
                name, module, self.mode, torch.is_grad_enabled(),
                _detached(args, "args", swaps),
                dict(_detached(dict(kwargs or {}), "kwargs", swaps)),
                [] if edited else inputs, outputs, self.order,
                threading.get_ident() != self.thread, edited, started, _context(), batched))
        if key == self.root:
            self.mode = None

    def keep_grad(self, leaf: Leaf, grad: torch.Tensor | None) -> None:
        """A tensor hook's gradient kept on its leaf: the other model's tensor where that
        one's output holding the same value was handed the same gradient bit for bit (the
        hook's own is then let go as autograd goes on), else its own."""
        if grad is None:  # (an op with no autograd kernel, an int8 Linear's, hands None)
            return
        theirs = self.their_grads.get(id(leaf.value))
        if theirs is not None and theirs.dtype == grad.dtype and theirs.shape == grad.shape \
                and torch.equal(theirs, grad):
            grad = theirs
        leaf.grad, leaf.grad_version = grad.detach(), grad._version

    def _shared(self, leaves: list[Leaf]) -> list[Leaf]:
        """``leaves``, each equal to a value kept already holding that value (memory)."""
        kept = []
        for leaf in leaves:
            same, compared = self.known.keep(leaf.value)
            if same is not leaf.held:
                version = same.version if isinstance(same, Spilled) else same._version
                leaf = Leaf(leaf.path, same, version, leaf.tracked, nan_free=compared)
            kept.append(leaf)
        return kept

    def _start(self) -> None:
        if torch.is_inference_mode_enabled():
            self.mode = None
            return
        mode = AUTOGRAD if torch.is_grad_enabled() else NO_GRAD
        self.mode = None if mode in self.kept else mode
        self.kept.add(mode)
        self.thread = threading.get_ident()


@contextlib.contextmanager
def capture_calls(model: torch.nn.Module, share: Calls | None = None,
                  gradients: bool = False, hold_bytes: int | None = None,
                  ) -> Iterator[Calls]:
    """Keep what each of ``model``'s modules saw in the plain calls made inside.

    ``share``: another model's calls (the reference's): a value equal to one of theirs bit
    for bit is kept as theirs. ``gradients``: each output of the first call with autograd
    on gets a tensor hook, and a backward of that call fills ``Leaf.grad`` (the hook
    returns nothing: the gradient flows on unchanged).
    """
    # one budget for both models: the candidate's hooks go on from the reference's
    # (each value's gradient hook is keyed by the value held: with gradients, all held)
    holding = share.holding if share is not None else Holding(hold_bytes)
    found = Calls(model, holding=holding if not gradients else Holding(None))
    found.holding.know_weights(model)
    hooks = _Hooks(model, found, share, gradients)
    pre = torch.nn.modules.module.register_module_forward_pre_hook(hooks.pre)
    post = torch.nn.modules.module.register_module_forward_hook(hooks.post, with_kwargs=True)
    # a module's own forward hooks run after the global ones and may replace its output
    # (a port scaling a layer's output in a hook): its call is taken after them
    hooked = [module for _, module in model.named_modules() if module._forward_hooks]
    hooks.late = {id(module) for module in hooked}
    late = [module.register_forward_hook(functools.partial(hooks.post, late=True),
                                         with_kwargs=True) for module in hooked]
    try:
        with warnings.catch_warnings():  # "global hooks fire an extra time for the
            # OptimizedModule": that extra call is the compiled module's own boundary
            warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
            yield found
    finally:
        remove_hook(pre)
        remove_hook(post)
        for handle in late:
            handle.remove()
        found.holding.flush()  # (what went to disk is there before anything reads it)


def _hook_first(tensor: torch.Tensor, hook: Any) -> None:
    """``hook`` on ``tensor``'s gradient, run before the hooks the port put there: what the
    module's consumers handed its output, not what a tensor hook of its own forward made
    of it (a hook inside a layer scales the gradient that layer's backward reads: the fault
    is that layer's, not its consumer's). Autograd runs a tensor's hooks in the insertion
    order of the dict it keeps them in (PyTorch 2.x reads the plain dict under the
    ``OrderedDict``, so ``move_to_end`` does not reorder them): the dict is refilled, ours
    first, in place (autograd holds that object). Where a subclass keeps them elsewhere,
    ours runs last."""
    handle = tensor.register_hook(hook)
    hooks = getattr(tensor, "_backward_hooks", None)
    if isinstance(hooks, OrderedDict) and handle.id in hooks:
        theirs = [(key, value) for key, value in hooks.items() if key != handle.id]
        if theirs:
            ours = hooks[handle.id]
            hooks.clear()
            hooks[handle.id] = ours
            hooks.update(theirs)


def remove_hook(handle: Any) -> None:
    """A hook taken off, and a global one's with-kwargs flag with it: torch's ``remove``
    leaves the hook's id in that table (PyTorch 2.x), and a port's build is checked for
    global changes, where that one would be ours."""
    handle.remove()
    torch.nn.modules.module._global_forward_hooks_with_kwargs.pop(  # type: ignore[attr-defined]
        handle.id, None)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _context() -> tuple[object, ...]:
    """What a caller may set around a module's call that its output hangs on, and that a
    run of the module alone must set again: autocast on each device (a region in bf16,
    ``with torch.autocast(...)`` around one layer) and the default dtype."""
    return (tuple((device, torch.get_autocast_dtype(device))
                  for device in _AUTOCAST_DEVICES if torch.is_autocast_enabled(device)),
            torch.get_default_dtype())


@contextlib.contextmanager
def call_context(call: ModuleCall) -> Iterator[None]:
    """``call``'s context set again (``ModuleCall.context``) around a run of its module
    alone: module evidence runs it on the reference's inputs as its caller ran it."""
    if not call.context:
        yield
        return
    autocast, default = call.context
    before = torch.get_default_dtype()
    with contextlib.ExitStack() as stack:
        for device, dtype in autocast:  # type: ignore[attr-defined]
            stack.enter_context(torch.autocast(device, dtype=dtype))
        torch.set_default_dtype(default)  # type: ignore[arg-type]
        try:
            yield
        finally:
            torch.set_default_dtype(before)


def probe(t: torch.Tensor, count: int = 16) -> tuple[float, ...]:
    """``count`` elements of ``t`` spread over it, in order, NaN and infinities read as 0 and
    -0 as 0: values equal bit for bit (``torch.equal``) probe equal; a hit is checked in
    full. Read as Python floats (exact for every float dtype): a few microseconds for each of
    the thousands of values a plain call's hooks and module evidence probe."""
    values = picked(t, _picks(t.numel(), count, t.device)).tolist()
    return tuple(float(v) + 0.0 if math.isfinite(v) else 0.0 for v in values)


def picked(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t.reshape(-1)[index]``, detached, without the copy ``reshape`` makes of a view laid
    out otherwise (module evidence reads a few elements of the reference's values seen in a
    port's layout: a copy each was a whole value per look). ``torch.take`` reads the
    elements where they lie, and in half the time of indexing (the hooks probe thousands)."""
    return torch.take(t.detach(), index)


@functools.lru_cache(maxsize=256)
def _picks(numel: int, count: int, device: torch.device) -> torch.Tensor:
    """The indices ``probe`` reads: ``count`` spread evenly over ``numel`` (made once)."""
    return spread(numel, count, device)


def _leaves(value: Any, path: str, depth: int = 0,
            tracked: dict[str, torch.Tensor] | None = None) -> list[Leaf]:
    """The floating tensors in ``value``, detached, with their versions; ``tracked``
    collects each one autograd tracks as it is (not detached), by path."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.is_meta or value.is_nested \
                or value.layout != torch.strided:  # (a fast path's nested tensor, sparse)
            return []
        try:
            version = value._version
        except RuntimeError:  # an inference tensor
            return []
        if tracked is not None and value.requires_grad and not wrapped(value):
            tracked[path] = value
        return [Leaf(path, value.detach() if not wrapped(value) else value, version,
                     value.requires_grad)]
    if depth >= _MAX_DEPTH:
        return []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)):
        items = list(enumerate(value))
    elif hasattr(value, "to_tuple") and callable(value.to_tuple):  # a ModelOutput
        items = list(enumerate(value.to_tuple()))
    else:
        return []
    found: list[Leaf] = []
    for key, item in items:
        found += _leaves(item, f"{path}.{key}", depth + 1, tracked)
    return found


def _read_back(value: Any) -> Any:
    """``value`` (a call's held arguments) with each spilled tensor read back."""
    if isinstance(value, Spilled):
        return value.load()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_read_back(v) for v in value)
    if isinstance(value, list):
        return [_read_back(v) for v in value]
    if isinstance(value, dict):
        return {k: _read_back(v) for k, v in value.items()}
    return value


def _detached(value: Any, path: str = "",
              swaps: Mapping[str, torch.Tensor | Spilled] | None = None) -> Any:
    """``value`` with its tensors detached (a rerun must not join the plain call's graph),
    each one a leaf holds at ``path`` replaced by the leaf's value (``swaps``)."""
    if isinstance(value, torch.Tensor):
        if swaps and path in swaps:
            return swaps[path]
        return value if wrapped(value) else value.detach()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_detached(v, f"{path}.{i}", swaps) for i, v in enumerate(value))
    if isinstance(value, list):
        return [_detached(v, f"{path}.{i}", swaps) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _detached(v, f"{path}.{k}", swaps) for k, v in value.items()}
    return value


def unbatch_call(args: Any, kwargs: Any, output: Any,
                 ) -> tuple[tuple[Any, ...], dict[str, Any], Any, frozenset[int]] | None:
    """A module call made under one ``vmap`` (its positional arguments and its output
    batched tensors of one level, over plain ones), as the whole batch: each batched
    tensor's underlying value with the batch dim first, and which positional arguments
    were batched. None for anything else (a keyword argument or a container holding a
    batched tensor, nested levels, ``grad``'s wrappers): its caller is the boundary then."""
    levels: set[int] = set()

    def whole(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not wrapped(t):
            return t
        found = whole_batch(t)
        if found is None:
            raise ValueError
        levels.add(torch._C._functorch.maybe_get_level(t))
        return found

    def holds_batched(value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return wrapped(value)
        if isinstance(value, (tuple, list)):
            return any(holds_batched(v) for v in value)
        if isinstance(value, dict):
            return any(holds_batched(v) for v in value.values())
        return False

    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    if any(holds_batched(v) for v in kwargs.values()) or any(
            not isinstance(a, torch.Tensor) and holds_batched(a) for a in args) \
            or not isinstance(output, torch.Tensor):
        return None
    try:
        wholes = tuple(whole(a) for a in args)
        out = whole(output)
    except (ValueError, RuntimeError):
        return None
    if len(levels) != 1 or out is output:
        return None
    batched = frozenset(i for i, a in enumerate(args) if a is not wholes[i])
    return wholes, kwargs, out.detach(), batched


def whole_batch(t: torch.Tensor) -> torch.Tensor | None:
    """A batched tensor of one ``vmap`` level as the whole batch: its underlying value, the
    batch dim first; None for anything else (nested levels, ``grad``'s wrappers)."""
    functorch = torch._C._functorch
    if not functorch.is_batchedtensor(t):
        return None
    inner = functorch.get_unwrapped(t)
    bdim = functorch.maybe_get_bdim(t)
    if wrapped(inner) or bdim is None or bdim < 0:
        return None
    return inner.movedim(bdim, 0)


def wrapped(tensor: torch.Tensor) -> bool:
    """A functorch tensor (``vmap``'s batched tensor, ``grad``'s wrapper)."""
    return bool(torch._C._functorch.is_functorch_wrapped_tensor(tensor))


__all__ = ["Calls", "Leaf", "ModuleCall", "call_context", "capture_calls", "picked", "probe",
           "remove_hook", "unbatch_call", "whole_batch", "wrapped"]
