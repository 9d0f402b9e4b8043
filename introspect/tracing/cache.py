"""A cache of traced graphs, in memory, for models made only of installed, unpatched code.

A notebook that re-traces, or ``introspect.trace`` called twice on one model, traces the
same HF model class with the same configuration and input shapes again; the graph is the
same every time. The cache keeps the graph, never the weights: a hit builds a new
GraphModule whose ``call_module``/``get_attr`` targets are the *new* model's own modules,
parameters and buffers, so a hit can never serve stale weights.

A graph is cached only where its key provably covers everything it depends on
(``cache_key`` returns None for any other model, and the tracer then traces it):

- every module's class, and every class in its MRO (``object`` and ``typing.Generic``
  aside), is defined in the installed ``torch`` or ``transformers`` package: found at its
  home (``module.QualName`` is that very class), in a file inside the package, never in
  ``__main__``, a notebook, ``exec`` or a function body. A user's port is never cached;
- no class of those is patched: every function in their ``__dict__`` (and behind every
  ``functools.wraps`` decorator, property, static and class method) is defined in the
  package, under its own class's name (or a base class's, as
  ``PreTrainedModel.cuda = Module.cuda``);
- no forward, pre-forward or backward hook on any module, and none of torch's global ones;
- every attribute on a module instance is a plain value (numbers, text, dtypes, and
  containers of them), a configuration (keyed by its full current ``to_dict()`` and every
  private field), or one of two things HF's activations hold: a torch built-in found at
  its home, or a method of the module's own class. A function, partial, callable object
  or anything else set on an instance makes the model uncacheable;
- every function in the namespaces the model's code reads (the modules of those classes
  and of their functions, torch, ``torch.nn.functional``, ``torch.Tensor``, HF's
  activation, mask and attention modules, and the classes of HF's objects found there,
  such as the attention registry's) is defined in an installed package or the standard
  library.

The key then holds the identity of each of those classes and of every value in their
``__dict__`` and in those namespaces (one level into containers: ``ACT2FN``, the
attention registry), so a function replaced at run time anywhere there misses the cache;
the configurations and every plain attribute by value; parameter and buffer names,
shapes, dtypes and devices; the input names, shapes and dtypes; train/eval, grad mode,
autocast, the default dtype, deterministic mode and the environment. Identities are
serials that are never reused, so a new object at a freed address is never taken for the
old one. The cache holds what it checked by weak reference where the object takes one: a
function seen during a trace (torch.fx's own ``Module.__call__`` wrapper holds the tracer,
and the tracer the model) must not keep the model alive once the trace is done.

Only memory: an earlier version also kept graphs on disk, as JSON, and was measured not
to earn its risk (docs/tracing.md, "a graph cache": a warm disk cache saved 2.5 to 4% of a
whole ``introspect trace`` process, under the 5% it had to earn). Nothing is read from or
written to any folder.
``INTROSPECT_NO_CACHE=1`` turns the cache off entirely.
"""

from __future__ import annotations

import collections
import copy
import functools
import hashlib
import itertools
import operator
import os
import sys
import sysconfig
import threading
import types
import typing
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx

from introspect.tracing.fx_module import build_graph_module
from introspect.tracing.records import NodeRecord

MEMORY_ENTRIES = 16  # graphs kept per process (each is a graph, not weights)
_INSTALLED = ("torch", "transformers")  # version-pinned packages a cached model may use
_REPLAYABLE = (*_INSTALLED, "introspect")  # a layer of these may be replayed (its BERT)
# transformers 5.25 requires ``kernels`` and decorates its activations with its
# use_kernel_forward_from_hub, which leaves on the class a condition function of kernels'
# own that only kernels.kernelize calls, never forward (kernelize swaps an instance's
# forward, which the instance check refuses). The condition is let through when it is
# installed code of one of these packages; any other function under that name is a patch.
_KERNEL_CONDITION = "kernel_condition"
_KERNEL_CONDITION_PACKAGES = ("kernels", *_INSTALLED)
# Modules the code of an HF model reads besides its own: their functions must be
# installed ones, and a value replaced there misses the cache.
_READ_MODULES = ("torch", "torch.nn.functional", "torch.nn.modules.module",
                 "transformers.activations", "transformers.masking_utils",
                 "transformers.modeling_utils", "transformers.integrations.sdpa_attention",
                 "transformers.pytorch_utils", "transformers.utils.generic",
                 "transformers.modeling_layers", "introspect.tracing.tracer",
                 "introspect.tracing.replay", "introspect.tracing.leaf_shapes",
                 "introspect.tracing.shapes", "introspect.tracing.traced_sizes",
                 "torch.fx._symbolic_trace")
# torch.nn.Module's own bookkeeping on every instance (hooks checked apart).
_MODULE_STATE = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks", "_is_full_backward_hook"})
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
          "_forward_pre_hooks_with_kwargs")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks",
                 "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")
# Class attributes defined elsewhere than under their own name, on purpose, by the package.
_KNOWN_ALIASES = frozenset({
    ("torch.nn.modules.module", "Module", "forward", "_forward_unimplemented"),
    ("torch.nn.modules.module", "Module", "smart_apply",
     "PreTrainedModel.initialize_weights.<locals>.smart_apply"),
})
_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
          torch.memory_format, torch.layout)
_DEPTH = 4  # levels of containers looked into (a config's nested dicts)
# Keys are computed from threads at once (trace holds its own lock only around fx): the
# snapshots and the identity serials are shared, and a serial given twice would make two
# objects look the same.
_LOCK = threading.RLock()


class Uncacheable(Exception):
    """Why a model's graph cannot be cached (its key would not cover what it depends on)."""


@dataclass
class CachedTrace:
    """What a trace produced, without weights: rebuild a GraphModule with ``bind``."""

    graph: torch.fx.Graph
    constants: dict[str, torch.Tensor]  # get_attr targets the graph owns (tensor constants)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    decisions: tuple[tuple[str, str, bool], ...]
    notes: tuple[str, ...]
    records: tuple[NodeRecord, ...]  # frozen rows, the same for every model the key fits


def enabled() -> bool:
    """False when ``INTROSPECT_NO_CACHE`` is set to anything but "" or "0"."""
    return os.environ.get("INTROSPECT_NO_CACHE", "") in ("", "0")


# -- the key -------------------------------------------------------------------------------

def cache_key(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
              fast: bool) -> str | None:
    """The sha256 of everything the traced graph depends on; None where that cannot be had.

    None (the tracer then traces for real, and caches nothing) for any model outside the
    rules of the module docstring; ``why_uncacheable`` says which rule.
    """
    try:
        with _LOCK:
            return _key(model, inputs, fast)
    except Uncacheable:
        return None


def why_uncacheable(model: torch.nn.Module) -> str | None:
    """The rule ``model`` breaks, in words, or None if its graph may be cached."""
    try:
        with _LOCK:
            _key(model, {}, True)
    except Uncacheable as e:
        return str(e)
    return None


def _key(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], fast: bool) -> str:
    parts: list[Any] = [fast, torch.is_grad_enabled(), torch.get_default_dtype(),
                        _autocast_state(), torch.are_deterministic_algorithms_enabled(),
                        sorted(os.environ.items())]
    hooks = [name for name in _GLOBAL_HOOKS
             if getattr(torch.nn.modules.module, name, None)]
    if hooks:
        raise Uncacheable(f"a global module hook is registered ({', '.join(hooks)})")
    modules = list(model.named_modules(remove_duplicate=False))
    namespaces: dict[int, Any] = {}
    for cls in dict.fromkeys(type(module) for _, module in modules):  # classes first
        for base in cls.__mro__:
            if base not in (object, typing.Generic):
                parts.append((_class_state(base, namespaces), _token(base)))
    configs: dict[int, str] = {}
    for name, module in modules:
        for hook in _HOOKS:
            if getattr(module, hook, None):
                raise Uncacheable(f"module {name or '(root)'} has a hook ({hook})")
        parts.append((name, _token(type(module)), _instance_state(name, module, configs)))
    for module_name in _READ_MODULES:
        module = sys.modules.get(module_name)
        if module is not None:
            namespaces.setdefault(id(vars(module)), vars(module))
    held: dict[type, None] = {torch.Tensor: None}  # its methods: x.softmax(...) and such
    for namespace in namespaces.values():
        parts.append(_namespace_state(namespace, held))
    for cls in held:  # the classes of HF's objects read there (the attention registry)
        for base in cls.__mro__:
            if base.__module__.split(".")[0] in _INSTALLED:
                parts.append(_namespace_state(base, {}))
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts.append((name, tuple(tensor.shape), str(tensor.dtype), str(tensor.device),
                      tensor.requires_grad, type(tensor).__qualname__))
    for name, tensor in inputs.items():
        parts.append((name, tuple(tensor.shape), str(tensor.dtype), str(tensor.device)))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _autocast_state() -> tuple[Any, ...]:
    return tuple(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))


def layer_state(module: torch.nn.Module, ignore: frozenset[str] = frozenset()) -> str | None:
    """What a layer's graph depends on besides its arguments; None where that is not known.

    For the layer replay (``introspect.tracing.replay``): the layer and every module in it
    are of classes from torch, transformers or introspect (at home, unpatched), carry no
    hooks, and hold only plain values and configurations, compared by value (private ones
    included; the names in ``ignore`` aside). A port's layer gives None: its graph may hang
    on anything (a private flag, a dict keyed on ``id(self)``), so it is traced for real.
    """
    try:
        with _LOCK:
            parts = _layer_parts(module, ignore)
    except Uncacheable:
        return None
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _layer_parts(module: torch.nn.Module, ignore: frozenset[str]) -> list[Any]:
    hooks = [name for name in _GLOBAL_HOOKS if getattr(torch.nn.modules.module, name, None)]
    if hooks:
        raise Uncacheable(f"a global module hook is registered ({', '.join(hooks)})")
    parts: list[Any] = []
    configs: dict[int, str] = {}
    namespaces: dict[int, dict[str, Any]] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        if any(getattr(sub, hook, None) for hook in _HOOKS):
            raise Uncacheable(f"module {name or '(root)'} has a hook")
        for base in type(sub).__mro__:
            if base not in (object, typing.Generic):
                parts.append((_class_state(base, namespaces, _REPLAYABLE), _token(base)))
        parts.append((name, _instance_state(name, sub, configs, ignore)))
    return parts


# -- classes: installed, at home, unpatched -------------------------------------------------

@functools.cache
def _package_roots(packages: tuple[str, ...] = _INSTALLED) -> tuple[str, ...]:
    """The folders of the installed packages a cached model's classes may come from."""
    roots = []
    for name in packages:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            roots.append(str(Path(file).resolve().parent) + os.sep)
    return tuple(roots)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Where a function read from a namespace may be defined: installed code, the stdlib."""
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.add(str(Path(__file__).parents[1]))  # introspect itself (installed editable too)
    return tuple(str(Path(f).resolve()) + os.sep for f in folders) \
        + _package_roots(_REPLAYABLE)


@functools.lru_cache(maxsize=4096)
def _file_under(filename: str, roots: tuple[str, ...]) -> bool:
    if filename.startswith("<frozen ") and filename.endswith(">"):  # the stdlib's own
        return filename[8:-1].split(".")[0] in sys.stdlib_module_names \
            and roots == _library_roots()
    try:
        resolved = os.path.realpath(filename)
    except (OSError, ValueError):
        return False
    return os.path.isabs(resolved) and resolved.startswith(roots)


def _class_state(cls: type, namespaces: dict[int, dict[str, Any]],
                 packages: tuple[str, ...] = _INSTALLED) -> Any:
    """``cls``'s attributes by identity, after checking it is installed and unpatched."""
    where = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__module__.split(".")[0] not in packages or "<locals>" in cls.__qualname__:
        raise Uncacheable(f"class {where} is not from an installed package "
                          f"({', '.join(packages)}): a port's graph is never cached")
    home = sys.modules.get(cls.__module__)
    found: Any = home
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not cls or not _file_under(getattr(home, "__file__", "") or "",
                                           _package_roots(packages)):
        raise Uncacheable(f"class {where} is not the class of that name in its package")

    def build(names: tuple[str, ...], values: tuple[Any, ...]) -> _Snapshot:
        snapshot = _Snapshot(cls, names, tuple(map(_hold, values)))
        for name, value in zip(names, values, strict=True):
            for function in _functions_in(value):
                _check_class_function(cls, name, function, packages)
                snapshot.reads.append(function.__globals__)
        _fill(snapshot, values, where)
        return snapshot

    snapshot = _snapshot(cls, packages, vars(cls), build)
    for namespace in snapshot.reads:
        namespaces.setdefault(id(namespace), namespace)
    return _state(snapshot, where)


def _functions_in(value: Any) -> list[types.FunctionType]:
    """Every Python function a class attribute runs: itself, its wrapped chain, accessors."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        candidates = [value.fget, value.fset, value.fdel]
    elif isinstance(value, functools.cached_property):
        candidates = [value.func]
    else:
        candidates = [value]
    functions = []
    for candidate in candidates:
        seen = 0
        while isinstance(candidate, types.FunctionType) and seen < 16:
            functions.append(candidate)
            candidate = getattr(candidate, "__wrapped__", None)
            seen += 1
    return functions


def _check_class_function(cls: type, name: str, function: types.FunctionType,
                          packages: tuple[str, ...]) -> None:
    """A function on an installed class must be the package's own, under its own name."""
    where = f"{cls.__module__}.{cls.__qualname__}.{name}"
    if name == _KERNEL_CONDITION \
            and function.__module__.split(".")[0] in _KERNEL_CONDITION_PACKAGES \
            and _file_under(function.__code__.co_filename,
                            _package_roots(_KERNEL_CONDITION_PACKAGES)):
        return
    wrapper = getattr(function, "__wrapped__", None) is not None
    # A decorator's wrapper may come from the standard library (contextlib's, for
    # torch.no_grad); the function it wraps is checked next, and must be the package's.
    if not _file_under(function.__code__.co_filename,
                       _library_roots() if wrapper else _package_roots(packages)):
        raise Uncacheable(f"{where} is patched: it runs code from "
                          f"{function.__code__.co_filename}, outside the installed package")
    if wrapper:
        return
    qualname = function.__qualname__
    if function.__module__ == cls.__module__ and qualname == f"{cls.__qualname__}.{name}":
        return
    owner, _, _ = qualname.rpartition(".")
    if any(base.__module__ == function.__module__ and base.__qualname__ == owner
           for base in cls.__mro__):
        return  # a base class's method, taken over by name (PreTrainedModel.cuda)
    if (cls.__module__, cls.__qualname__, name, qualname) in _KNOWN_ALIASES:
        return
    raise Uncacheable(f"{where} is patched: it is {function.__module__}.{qualname}")


# -- instances: plain values and configurations only ---------------------------------------

def _instance_state(path: str, module: torch.nn.Module, configs: dict[int, str],
                    ignore: frozenset[str] = frozenset()) -> list[Any]:
    """The instance's own attributes by value, or Uncacheable for anything not plain."""
    state: list[tuple[str, Any]] = []
    for name, value in vars(module).items():
        if name in _MODULE_STATE or name in _HOOKS or name in ignore:
            continue
        where = f"{path or '(root)'}.{name}"
        if _is_config(value):
            if id(value) not in configs:
                configs[id(value)] = _config_state(value, where)
            state.append((name, configs[id(value)]))
        elif name != "forward" and (_is_own_builtin(value) or _is_own_method(module, value)):
            state.append((name, _token(value)))
        else:
            state.append((name, _plain(value, 0, where)))
    return state


def _is_config(value: Any) -> bool:
    """An HF model or generation configuration (keyed by its values)."""
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return False
    kinds = tuple(getattr(transformers, name) for name in ("PretrainedConfig",
                                                            "GenerationConfig"))
    return isinstance(value, kinds)


def _config_state(config: Any, where: str) -> str:
    """A configuration by its full current ``to_dict()`` and every private field."""
    try:
        exported = config.to_dict()
    except Exception as e:  # noqa: BLE001 - a config that cannot export itself
        raise Uncacheable(f"{where}: the configuration cannot be exported ({e})") from e
    own = {k: v for k, v in vars(config).items()}
    return repr((type(config).__module__, type(config).__qualname__, _token(type(config)),
                 _plain(exported, 0, where), _plain(own, 0, where)))


def _is_own_builtin(value: Any) -> bool:
    """A torch built-in found at its home (``GELUActivation.act = F.gelu``)."""
    if not isinstance(value, types.BuiltinFunctionType):
        return False
    module = getattr(value, "__module__", None) or ""
    if module.split(".")[0] != "torch" or getattr(value, "__self__", None) not in (
            None, sys.modules.get(module)):
        return False
    return getattr(sys.modules.get(module), value.__name__, None) is value


def _is_own_method(module: torch.nn.Module, value: Any) -> bool:
    """A method of the module's own class, bound to it (``self.act = self._gelu_python``)."""
    if not isinstance(value, types.MethodType) or value.__self__ is not module:
        return False
    return getattr(type(module), value.__func__.__name__, None) is value.__func__


def _plain(value: Any, depth: int, where: str) -> Any:
    """A plain value as a comparable form, or Uncacheable for anything that may run code."""
    if isinstance(value, _PLAIN) and type(value) in _PLAIN:
        return (type(value).__name__, repr(value))
    if depth < _DEPTH:
        if type(value) in (tuple, list, torch.Size):
            return (type(value).__name__, [_plain(v, depth + 1, where) for v in value])
        if type(value) in (set, frozenset):
            return ("set", sorted(repr(_plain(v, depth + 1, where)) for v in value))
        if type(value) in (dict, collections.OrderedDict):
            return ("dict", [(_plain(k, depth + 1, where), _plain(v, depth + 1, where))
                             for k, v in value.items()])
        if _is_config(value):
            return _config_state(value, where)
    raise Uncacheable(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, "
                      "not a plain value: only plain attributes and configurations are keyed")


# -- namespaces the code reads, and identities ---------------------------------------------

def _namespace_state(owner: dict[str, Any] | type, held: dict[type, None]) -> Any:
    """Every value of a module's namespace (or a class's) by identity, functions checked.

    The classes of HF's objects found there are added to ``held``: their methods run too
    (``ALL_ATTENTION_FUNCTIONS.get_interface``).
    """
    namespace = vars(owner) if isinstance(owner, type) else owner
    where = str(owner.__qualname__ if isinstance(owner, type)
                else namespace.get("__name__", "a namespace"))

    def build(names: tuple[str, ...], values: tuple[Any, ...]) -> _Snapshot:
        snapshot = _Snapshot(owner, names, tuple(map(_hold, values)))
        _fill(snapshot, values, where)
        return snapshot

    snapshot = _snapshot(owner, "read", namespace, build)
    held.update(dict.fromkeys(snapshot.types))
    return _state(snapshot, where)


@dataclass
class _Snapshot:
    """A class's or module's attributes as last checked; valid while they are the same.

    ``owner`` is kept alive; each value is held by ``_hold`` (weakly where it can be), so
    a value that died is never taken for a new object at its address.
    """

    owner: Any
    names: tuple[str, ...]
    values: tuple[Any, ...]  # ``_hold`` of each value: call it for the value (None: died)
    digest: str = ""  # of each value's identity (each checked)
    mutable: list[tuple[str, Any]] = field(default_factory=list)  # re-read every time
    reads: list[dict[str, Any]] = field(default_factory=list)  # its functions' globals
    types: list[type] = field(default_factory=list)  # classes of HF's objects in it


_SNAPSHOTS: dict[tuple[int, Any], _Snapshot] = {}


def _snapshot(owner: Any, rules: Any, namespace: Mapping[str, Any],
              build: Any) -> _Snapshot:
    """The snapshot of ``namespace``, built again (and checked) when any value changed."""
    names, values = tuple(namespace), tuple(namespace.values())
    held = _SNAPSHOTS.get((id(owner), rules))
    if held is not None and held.owner is owner and held.names == names \
            and all(map(operator.is_, (h() for h in held.values), values)):
        return held
    snapshot: _Snapshot = build(names, values)  # Uncacheable leaves nothing behind
    _SNAPSHOTS[(id(owner), rules)] = snapshot
    return snapshot


def _fill(snapshot: _Snapshot, values: tuple[Any, ...], where: str) -> None:
    state = []
    for name, value in zip(snapshot.names, values, strict=True):
        if name in ("__builtins__", "__all__", "__doc__", "__annotations__"):
            continue  # a namespace's own bookkeeping (``__builtins__`` is the interpreter's)
        state.append((name, _value_state(value, 0, f"{where}.{name}")))
        if _mutable(value):
            snapshot.mutable.append((name, value))
        if not isinstance(value, (type, types.ModuleType, types.FunctionType)) \
                and type(value).__module__.startswith("transformers."):
            snapshot.types.append(type(value))
    snapshot.digest = hashlib.sha256(repr(state).encode()).hexdigest()


def _is_mapping(value: Any) -> bool:
    """A dict, or one of HF's mappings (``ACT2FN``, the registries); cheap on anything else."""
    return isinstance(value, dict) or (type(value).__module__.startswith("transformers.")
                                       and isinstance(value, Mapping))


def _mutable(value: Any) -> bool:
    """A container that can change in place (``ACT2FN``, a registry): read every time."""
    return not isinstance(value, (type, types.ModuleType)) \
        and (_is_mapping(value) or type(value) in (list, set))


def _state(snapshot: _Snapshot, where: str) -> Any:
    return (snapshot.digest, [(name, _value_state(value, 0, f"{where}.{name}"))
                             for name, value in snapshot.mutable])


def _value_state(value: Any, depth: int, where: str) -> Any:
    """A value's identity, and one level into containers and registries (``ACT2FN``)."""
    if type(value) in _PLAIN:
        return repr(value)
    if isinstance(value, types.FunctionType) \
            and not _file_under(value.__code__.co_filename, _library_roots()):
        raise Uncacheable(f"{where} is {value.__module__}.{value.__qualname__}, defined in "
                          f"{value.__code__.co_filename}, not in an installed package")
    if depth < 2 and not isinstance(value, (type, types.ModuleType)):
        if _is_mapping(value):
            try:
                items = list(value.items())
            except Exception:  # noqa: BLE001 - a mapping that cannot list itself
                return _token(value)
            return (_token(value), [(repr(k), _value_state(v, depth + 1, f"{where}[{k!r}]"))
                                    for k, v in items])
        if type(value) in (list, tuple, set, frozenset) and len(value) <= 4096:
            return (_token(value), [_value_state(v, depth + 1, where) for v in value])
    return _token(value)


_TOKENS: dict[int, tuple[Any, int]] = {}  # id -> (``_hold`` of the object, its serial)
_SERIALS = itertools.count(1)


def _token(value: Any) -> int:
    """A serial for ``value`` that no other object ever gets (serials only grow)."""
    held = _TOKENS.get(id(value))
    if held is not None and held[0]() is value:
        return held[1]
    serial = next(_SERIALS)
    forget = functools.partial(_forget_token, _TOKENS, id(value))
    _TOKENS[id(value)] = (_hold(value, forget), serial)
    return serial


def _forget_token(tokens: dict[int, tuple[Any, int]], key: int, reference: Any) -> None:
    """A tokened object died: drop its entry (its serial is never given again). The dict
    is bound, not looked up: at exit, module globals are gone before the last objects."""
    held = tokens.get(key)
    if held is not None and held[0] is reference:
        del tokens[key]


class _Strong:
    """A strong reference that reads like a weak one: for objects that take no weak one."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value


def _hold(value: Any, forget: Any = None) -> Any:
    """``value`` held weakly where it can be (functions, classes, bound methods), else
    strongly (numbers, strings, dicts, tuples: module constants): call it for the value.

    What the cache checks may be a model's own (a bound method on a module, torch.fx's
    ``Module.__call__`` wrapper seen while a layer is keyed during a trace, which holds
    the tracer and so the model): held strongly, every model traced would live forever.
    """
    try:
        return weakref.ref(value, forget)
    except TypeError:
        return _Strong(value)


# -- in memory -----------------------------------------------------------------------------

_MEMORY: collections.OrderedDict[str, CachedTrace] = collections.OrderedDict()


def remember(key: str, gm: torch.fx.GraphModule, input_names: tuple[str, ...],
             output_names: tuple[str, ...], decisions: list[Any], notes: list[str],
             records: list[NodeRecord]) -> CachedTrace:
    """Keep what ``gm`` was traced into, without its weights, under ``key``."""
    constants = {n.target: _fetch(gm, n.target) for n in gm.graph.nodes
                 if n.op == "get_attr" and str(n.target).startswith("_tensor_constant")}
    entry = CachedTrace(_copy_graph(gm.graph), constants, tuple(input_names),
                        tuple(output_names),
                        tuple((d.node, d.expression, d.answer) for d in decisions),
                        tuple(notes), tuple(records))
    _MEMORY[key] = entry
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > MEMORY_ENTRIES:
        _MEMORY.popitem(last=False)
    return entry


def recall(key: str) -> CachedTrace | None:
    """The entry under ``key``, or None."""
    entry = _MEMORY.get(key)
    if entry is not None:
        _MEMORY.move_to_end(key)
    return entry


def write_entry(key: str, entry: CachedTrace) -> bool:
    """Nothing: the cache keeps no files (see the module docstring). Always False."""
    del key, entry
    return False


def clear_memory() -> None:
    """Forget every graph kept in this process."""
    _MEMORY.clear()


def bind(entry: CachedTrace, model: torch.nn.Module) -> torch.fx.GraphModule:
    """A GraphModule running ``entry``'s graph on ``model``'s own modules and weights."""
    gm = build_graph_module(_Targets(model, entry.constants), _copy_graph(entry.graph),
                            type(model).__name__)
    gm.training = model.training
    return gm


class _Targets(torch.nn.Module):
    """The model's attributes, with the graph's own tensor constants added on top."""

    def __init__(self, model: torch.nn.Module, constants: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.__dict__["_model"] = model
        self.__dict__["_constants"] = constants
        self.training = model.training

    def __getattr__(self, name: str) -> Any:
        constants = self.__dict__["_constants"]
        if name in constants:
            return constants[name]
        return getattr(self.__dict__["_model"], name)


def _fetch(root: Any, target: str) -> Any:
    value = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    copied = torch.fx.Graph(tracer_cls=graph._tracer_cls)
    values: dict[torch.fx.Node, torch.fx.Node] = {}
    output = copied.graph_copy(graph, values)
    old_output = next(iter(reversed(graph.nodes)))  # torch 2.11: not an iterator
    new_output = copied.output(output, old_output.type)
    new_output.meta = copy.copy(old_output.meta)
    return copied


__all__ = ["CachedTrace", "Uncacheable", "cache_key", "enabled", "why_uncacheable"]
