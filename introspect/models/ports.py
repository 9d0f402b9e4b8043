"""A user's port as a diff candidate: ``path/to/port.py:build`` or ``package.module:build``.

``build`` is any callable that takes the loaded reference (a ``LoadedReference``: the HF
model, its config, checkpoint folder and tokenizer) and returns the ``nn.Module`` to
check; typically it builds the port and loads the reference's weights into it::

    # my_port.py
    def build(reference):
        model = MyBert(reference.config.hidden_size, ...)
        model.load_state_dict(convert(reference.model.state_dict()))
        return model

    $ introspect diff --model bert-tiny --candidate my_port.py:build

Every way a spec can be wrong (no such file or module, no such attribute, not callable,
raises, returns something that is not a module) is an ``InputError`` naming the spec.

A port is untrusted code and cannot harm the run: each file is imported under a module
name of its own path (two ``port.py`` in two folders each run their own code); anything
it raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is an ``InputError``; and
the reference is fingerprinted around ``build`` (``fingerprint``, ``what_changed``), so
that a build that changes it, even by one bit, is refused.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import importlib.util
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from introspect.errors import InputError


@dataclass(frozen=True)
class LoadedReference:
    """What a port's ``build`` receives: the reference HF model, loaded offline."""

    model: Any  # the HF BertModel / BertFor* in eval mode
    config: Any  # its transformers.BertConfig (``model.config``)
    folder: Path | None  # the checkpoint folder; None for random-init models
    tokenizer: Any
    source: str  # the --model it came from: minilm, bert-tiny, a folder, ...
    head: str  # base, sequence-classification, ...
    attn: str  # sdpa or eager


def is_port_spec(spec: str) -> bool:
    """``file.py:NAME`` or ``package.module:NAME`` (a Windows drive letter is not a spec)."""
    source, sep, name = spec.rpartition(":")
    return bool(sep and source and name) and not (len(source) == 1 and source.isalpha())


def resolve_builder(spec: str, what: str = "port") -> Callable[[LoadedReference], Any]:
    """Import the callable a spec names, without calling it. ``what`` names the spec in
    the errors ("port", or "--loss" for a loss).

    Raises:
        InputError: the file or module is missing or fails to import, it has no such
            attribute, or the attribute is not callable.
    """
    source, _, name = spec.rpartition(":")
    if not is_port_spec(spec):
        raise InputError(f"{what} {spec!r}: expected path/to/file.py:NAME or "
                         "package.module:NAME")
    module = _import_file(spec, source, what) if _is_file(source) else \
        _import_module(spec, source, what)
    target: Any = module
    for part in name.split("."):  # build or Class.build
        if not hasattr(target, part):
            module_name = os.path.basename(source) if _is_file(source) else source
            raise InputError(f"{what} {spec!r}: {module_name} has no attribute {name!r}")
        target = getattr(target, part)
    if not callable(target):
        does = ("that takes the loaded reference and returns an nn.Module" if what == "port"
                else "loss(outputs, inputs) -> scalar")
        raise InputError(f"{what} {spec!r}: {name} is a {type(target).__name__}, not a "
                         f"callable {does}")
    return target  # type: ignore[no-any-return]


def check_port_source(spec: str) -> None:
    """Check a port spec without running any of its code: its file exists.

    The file is imported later, once the reference's truth has been taken
    (``introspect.run.deferred``): importing it may already change torch or transformers.

    Raises:
        InputError: not a spec, or a file spec whose file does not exist.
    """
    source, _, _ = spec.rpartition(":")
    if not is_port_spec(spec):
        raise InputError(f"port {spec!r}: expected path/to/port.py:NAME or package.module:NAME")
    if _is_file(source) and not Path(source).is_file():
        raise InputError(f"port {spec!r}: no such file {source!r}")


def build_port(spec: str, builder: Callable[[LoadedReference], Any],
               reference: LoadedReference, before: Fingerprint | None = None) -> Any:
    """Call the builder on the reference; the ``nn.Module`` it returns.

    The reference model is fingerprinted before the call (or ``before`` is its fingerprint)
    and checked after it: a build that changes the reference would make any verdict a lie.

    Raises:
        InputError: the builder raises anything (``SystemExit`` and ``KeyboardInterrupt``
            included; a real Ctrl-C stays an interrupt), returns something that is not an
            ``nn.Module``, or changed the reference model.
    """
    import torch

    before = before if before is not None else fingerprint(reference.model)
    try:
        with port_code([spec], "in its build"):
            model = builder(reference)
    except PortStopped:
        raise
    except Exception as e:  # the user's code: any failure is a bad candidate, said in one line
        if os.environ.get("INTROSPECT_DEBUG"):
            raise
        raise InputError(f"port {spec!r} raised {_one_line(e)}") from e
    changes = what_changed(before, fingerprint(reference.model), switches_too=False)
    if changes:
        raise InputError(f"the port's build changed the reference: "
                         f"{describe_changes(changes, width=CHANGES_WIDTH)} ({spec}; copy what "
                         "it changes)")
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"port {spec!r} returned a {type(model).__name__}, not a "
                         "torch.nn.Module")
    return model


class PortStopped(InputError):
    """A port raised what is not an ``Exception`` (``sys.exit``, ``KeyboardInterrupt``)."""


@contextlib.contextmanager
def port_code(specs: Sequence[str], where: str, kind: str = "port") -> Iterator[None]:
    """Run a port's code: what it raises beyond ``Exception`` becomes one ``InputError``.

    ``SystemExit`` (``sys.exit(0)`` too), a ``KeyboardInterrupt`` the port raises itself,
    ``GeneratorExit`` and the like would otherwise end the run with no verdict, exit code 0
    for ``sys.exit(0)``. A real Ctrl-C (SIGINT while the code runs) stays an interrupt.
    ``Exception`` passes through for the caller to word. With two ports, the one whose
    file the traceback goes through is named.
    """
    if not specs:  # no port runs here: nothing to guard
        yield
        return
    from introspect.models import guards

    RAN.update(specs)
    interrupted: list[int] = []
    with guards.contained(), _sigint_noted(interrupted):
        try:
            yield
        except Exception:
            raise
        except BaseException as e:
            if os.environ.get("INTROSPECT_DEBUG") or interrupted \
                    and isinstance(e, KeyboardInterrupt):
                raise
            spec = _blamed(specs, e.__traceback__)
            raise PortStopped(f"{kind} {spec!r} {_exit_described(e)} {where}; no verdict "
                             "(a port must return or raise, never exit)") from e


RAN: set[str] = set()  # every spec whose code ran in this process (for the CLI's wording)



# --- The reference's fingerprint ------------------------------------------------------
#
# Everything a forward of the reference computes with, captured so that a later capture
# can be compared bit for bit: each parameter and buffer (a SHA-256 of its bytes), each
# module object under its name with its own attributes (hooks, an instance ``forward``,
# ``eps``, ``training``), the functions of its classes, the global module hooks and the
# torch settings a forward reads. Objects are compared by identity, values by value.


@dataclass(frozen=True)
class Fingerprint:
    """A model's state, to compare with ``what_changed``; see ``fingerprint``."""

    tensors: dict[str, tuple[str, tuple[int, ...], bytes]]  # name -> dtype, shape, SHA-256
    modules: dict[str, tuple[Any, dict[str, Any]]]  # name -> (the module, its attributes)
    classes: dict[Any, dict[str, Any]]  # module classes (MRO too), torch -> their functions
    config: dict[str, Any]  # the model's config attributes
    torch_state: dict[str, Any]  # global hooks, default dtype, function modes


class _Same:
    """An object that compares equal only to itself (its identity is the fingerprint)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def fingerprint(model: Any, *, tensors: bool = True) -> Fingerprint:
    """Capture ``model``'s state bit for bit (see ``what_changed``).

    ``tensors=False`` leaves out the parameters and buffers (hashing them reads every
    weight): for a caller that proves them unchanged otherwise (by identity and version
    counter, as generation does at every step).

    Example::

        before = fingerprint(reference)
        build(reference)
        assert not what_changed(before, fingerprint(reference))
    """
    import torch

    digests: dict[int, bytes] = {}  # a tied weight is hashed once
    hashed = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False),
                         *model.named_buffers(remove_duplicate=False)] if tensors else []:
        if id(tensor) not in digests:
            digests[id(tensor)] = _digest(tensor)
        hashed[name] = (str(tensor.dtype), tuple(tensor.shape), digests[id(tensor)])
    modules = {}
    owners: list[Any] = [torch, torch.nn.functional, torch.Tensor]
    for name, module in model.named_modules(remove_duplicate=False):
        attributes = {key: _snapshot(value) for key, value in vars(module).items()
                      if key not in ("_parameters", "_buffers", "_modules")}
        modules[name] = (_Same(module), attributes)
        owners += type(module).__mro__[:-1]  # object's own functions cannot be patched
    owners.append(torch._C.TensorBase)  # Tensor.softmax and most methods live here
    # The Python modules that define the model's classes: their functions and globals
    # (``modeling_bert.eager_attention_forward``, a shared port helper's constants).
    owners += [sys.modules[cls.__module__] for owner in list(owners) if isinstance(owner, type)
               for cls in (owner,) if cls.__module__ in sys.modules
               and not cls.__module__.startswith(("torch", "builtins"))]
    classes = {owner: {key: _global_snapshot(value) for key, value in vars(owner).items()
                       if (callable(value) or isinstance(value, (staticmethod, classmethod,
                                                                 property))
                           or (not isinstance(owner, type) and type(value) in _SIMPLE))
                       and not (owner is torch and key in _FOLLOW_SWITCHES)}
               for owner in dict.fromkeys(owners)}
    config = getattr(model, "config", None)
    config_state = {key: _snapshot(value) for key, value in vars(config).items()} \
        if config is not None and hasattr(config, "__dict__") else {}
    from torch.nn.modules import module as module_module

    torch_state: dict[str, Any] = {
        name: _snapshot(hooks) for name, hooks in vars(module_module).items()
        if name.startswith("_global_") and isinstance(hooks, dict)}
    torch_state["default dtype"] = str(torch.get_default_dtype())
    torch_state["float32 matmul precision"] = _matmul_precision()
    torch_state["torch function modes"] = torch._C._len_torch_function_stack()
    torch_state["autocast"] = _autocast_state()
    # Switches a forward reads that no value of the model shows: a build that leaves grad
    # off, or turns the fast path off (so a fault only the fast path computes stays hidden).
    torch_state["grad mode"] = "on" if torch.is_grad_enabled() else "off"
    torch_state["inference mode"] = "on" if torch.is_inference_mode_enabled() else "off"
    torch_state["deterministic algorithms"] = torch.are_deterministic_algorithms_enabled()
    torch_state["attention fast path"] = _fastpath_state()
    from introspect.run import switches

    torch_state["sdpa backends"] = _snapshot(switches.snapshot().get("sdpa backends"))
    attention = _attention_registry()
    if attention is not None:
        torch_state["attention functions"] = attention
    return Fingerprint(hashed, modules, classes, config_state, torch_state)


_SIMPLE = (bool, int, float, str)
# torch's own aliases that a switch rebinds (``set_default_dtype`` points ``torch.Storage``
# at another storage class): the switch itself is fingerprinted, and judged by values.
_FOLLOW_SWITCHES = frozenset({"Storage"})


def _global_snapshot(value: Any) -> Any:
    """A module's function or class by identity; a plain value (a constant) by value."""
    return _snapshot(value) if type(value) in _SIMPLE else _Same(value)


def _matmul_precision() -> Any:
    """The float32 matmul precision, by the legacy getter or the per-backend settings.

    The legacy getter raises once the per-backend API
    (``torch.backends.cuda.matmul.fp32_precision``) has been used.
    """
    import torch

    settings: dict[str, Any] = {}
    try:
        settings["legacy"] = torch.get_float32_matmul_precision()
    except Exception:  # noqa: BLE001  the per-backend API is in use
        settings["legacy"] = "mixed"
    for path in ("fp32_precision", "cuda.matmul.fp32_precision", "mkldnn.matmul.fp32_precision",
                 "cudnn.conv.fp32_precision"):
        target: Any = torch.backends
        try:
            for part in path.split("."):
                target = getattr(target, part)
        except Exception:  # noqa: BLE001  not in this torch
            continue
        settings[path] = str(target)
    return _snapshot(settings)


def _fastpath_state() -> Any:
    import torch

    try:
        return "on" if torch.backends.mha.get_fastpath_enabled() else "off"
    except Exception:  # noqa: BLE001  an older torch
        return "unknown"


def _autocast_state() -> Any:
    import torch

    state = {}
    for device in ("cpu", "cuda"):
        try:
            state[device] = (f"on ({torch.get_autocast_dtype(device)})"
                             if torch.is_autocast_enabled(device) else "off")
        except Exception:  # noqa: BLE001  an older torch
            continue
    return _snapshot(state)


def _attention_registry() -> Any:
    """transformers' attention functions by name (``"sdpa"`` can be re-registered)."""
    module = sys.modules.get("transformers.modeling_utils")
    registry = getattr(module, "ALL_ATTENTION_FUNCTIONS", None)
    if registry is None:
        return None
    mapping = {**getattr(type(registry), "_global_mapping", {}),
               **getattr(registry, "_local_mapping", {})}
    return _snapshot({str(k): v for k, v in mapping.items()})


def what_changed(before: Fingerprint, after: Fingerprint, *,
                 switches_too: bool = True) -> list[str]:
    """What differs between two fingerprints of one model, one phrase each, names first.

    ``switches_too=False`` leaves out process-wide switches (``introspect.run.switches``):
    the diff judges those by values, the reference's and the candidate's.
    """
    from introspect.run.switches import SWITCHES

    changes = []
    for name in before.torch_state:
        if not switches_too and name in SWITCHES:
            continue
        old, new = before.torch_state[name], after.torch_state.get(name)
        if old != new:
            what = name.removeprefix("_global_").replace("_", " ")
            changes.append(f"torch's global {what}" if name.startswith("_global_")
                           else f"torch's {what} ({_shown_change(old, new)})")
    for owner, functions in before.classes.items():
        now = after.classes.get(owner, {})
        for key in dict.fromkeys([*functions, *now]):  # patched, deleted or added
            if now.get(key) != functions.get(key) and not _compile_machinery(now.get(key)):
                where = "on the class" if isinstance(owner, type) else "in the module"
                name = owner.__qualname__ if isinstance(owner, type) else owner.__name__
                changes.append(f"{name}.{key} (patched {where})")
    said: dict[str, str] = {}  # module name -> replaced or removed (said of all inside)
    moved: set[str] = set()  # modules put in another mode (said of the top one only)
    for name, (module, attributes) in before.modules.items():
        where = name or type(module.value).__name__
        parent = name.rpartition(".")[0] if "." in name else ("" if name else None)
        if parent is not None and said.get(parent) in ("replaced", "removed"):
            said[name] = said[parent]  # a replaced module's insides are new, of course
            continue
        if name not in after.modules:
            changes.append(f"{where} (removed)")
            said[name] = "removed"
            continue
        now_module, now = after.modules[name]
        if now_module != module:
            changes.append(f"{where} (replaced by a {type(now_module.value).__name__})")
            said[name] = "replaced"
            continue
        for key in sorted(set(attributes) | set(now)):
            if attributes.get(key, _MISSING) != now.get(key, _MISSING):
                if key == "training" and parent in moved:  # said of its parent already
                    moved.add(name)
                    continue
                moved |= {name} if key == "training" else set()
                changes.append(_attribute_change(where, key, attributes.get(key, _MISSING),
                                                 now.get(key, _MISSING)))
    changes += [f"{name} (added)" for name in after.modules if name not in before.modules
                and said.get(name.rpartition(".")[0]) != "replaced"]
    for name, (dtype, shape, digest) in before.tensors.items():
        if name not in after.tensors:
            changes.append(f"{name} (removed)")
            continue
        new_dtype, new_shape, new_digest = after.tensors[name]
        if (dtype, shape) != (new_dtype, new_shape):
            changes.append(f"{name} ({_tensor_change((dtype, shape), (new_dtype, new_shape))})")
        elif digest != new_digest:
            changes.append(name)
    changes += [f"{name} (added)" for name in after.tensors if name not in before.tensors]
    for key in sorted(set(before.config) | set(after.config)):
        old, new = before.config.get(key, _MISSING), after.config.get(key, _MISSING)
        if old != new:
            changes.append(f"config.{key} ({_shown(old)} -> {_shown(new)})")
    return changes


def _tensor_change(old: tuple[str, tuple[int, ...]], new: tuple[str, tuple[int, ...]]) -> str:
    """``float32 -> bfloat16`` (a cast), ``[4, 8] -> [8, 4]``, or both where both differ."""
    dtypes = (old[0].removeprefix("torch."), new[0].removeprefix("torch."))
    shapes = (str(list(old[1])), str(list(new[1])))
    differ = [pair for pair in (dtypes, shapes) if pair[0] != pair[1]]
    return " -> ".join(" ".join(side) for side in zip(*differ, strict=True))


def _compile_machinery(value: Any) -> bool:
    """torch.compile's own patches (dynamo wraps ``nn.Module.__init__`` on first use)."""
    inner = value.value if isinstance(value, _Same) else None
    return (getattr(inner, "__module__", "") or "").startswith("torch._dynamo")


CHANGES_WIDTH = 70  # characters of changes a refusal names (a line under 200 in all)


def describe_changes(changes: Sequence[str], most: int = 4, width: int | None = None) -> str:
    """The first few changes and how many more, for one line: at most ``most``, and within
    ``width`` characters where given (at least the first, its end where it is longer)."""
    shown = list(changes[:1])
    if width is not None and shown and len(shown[0]) > width:  # a module's long dotted name
        shown[0] = "…" + shown[0][-(width - 1):]
    for change in changes[1:most]:
        if width is not None and len(", ".join([*shown, change])) > width:
            break
        shown.append(change)
    more = len(changes) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


_MISSING = _Same(object())
_HOOK_KINDS = {"_forward_hooks": "forward hook", "_forward_pre_hooks": "forward pre-hook",
               "_backward_hooks": "backward hook", "_backward_pre_hooks": "backward pre-hook"}


def _attribute_change(where: str, key: str, old: Any, new: Any) -> str:
    if key in _HOOK_KINDS or key.endswith("hooks"):
        kind = _HOOK_KINDS.get(key, key.strip("_").replace("_", " ").removesuffix("s"))
        grew = len(_items(new)) > len(_items(old))
        return f"{where} (a {kind} {'added' if grew else 'changed'})"
    if key == "forward":
        return f"{where}.forward (swapped on the instance)" if new is not _MISSING \
            else f"{where}.forward (instance override removed)"
    if key == "training":
        mode = "training" if new is True else "eval"
        return f"{where} (put in {mode} mode, with every module inside it)"
    if new is _MISSING:
        return f"{where}.{key} (deleted)"
    return f"{where}.{key} ({_shown(old)} -> {_shown(new)})"


def _items(snapshot: Any) -> Any:
    """The items of a container's snapshot (``(type name, items)``); none for the rest."""
    return snapshot[1] if isinstance(snapshot, tuple) and len(snapshot) == 2 \
        and isinstance(snapshot[1], (dict, tuple, frozenset)) else ()


def _shown_change(old: Any, new: Any) -> str:
    """``old -> new``; for two snapshots of a dict, only the keys that differ."""
    if all(isinstance(v, tuple) and len(v) == 2 and v[0] == "dict" for v in (old, new)):
        keys = [k for k in dict.fromkeys([*old[1], *new[1]])
                if old[1].get(k, _MISSING) != new[1].get(k, _MISSING)]
        return "; ".join(f"{k}: {_shown(old[1].get(k, _MISSING))} -> "
                         f"{_shown(new[1].get(k, _MISSING))}" for k in keys)
    return f"{_shown(old)} -> {_shown(new)}"


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "unset"
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "float":
        return repr(float.fromhex(value[1]))
    if isinstance(value, _Same):
        return f"a {type(value.value).__name__}"
    if isinstance(value, _TensorPrint):
        return f"a {value.dtype} tensor {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


@dataclass(frozen=True)
class _TensorPrint:
    dtype: str
    shape: tuple[int, ...]
    digest: bytes


_PLAIN = frozenset({type(None), bool, int, str, bytes})
_EMPTY_DICTS = frozenset({dict, collections.OrderedDict})


def _snapshot(value: Any, depth: int = 0) -> Any:
    """A value to compare by ``==`` later: plain values copied, objects by identity."""
    kind = type(value)
    if kind in _PLAIN:  # most attributes (a fast path: the same answers as below)
        return value
    if kind in _EMPTY_DICTS and not value:  # a module's hook dicts, mostly empty
        return (kind.__name__, {})
    import torch

    if value is None or isinstance(value, (bool, int, str, bytes)):
        return value
    if isinstance(value, float):
        return ("float", value.hex())  # bit for bit, and a NaN equals itself
    if isinstance(value, torch.Tensor):  # a tensor attribute that is no parameter or buffer
        return _TensorPrint(str(value.dtype), tuple(value.shape), _digest(value))
    if depth < 3 and (type(value) in (list, tuple) or isinstance(value, dict)):
        if isinstance(value, dict):
            return (type(value).__name__, {k: _snapshot(v, depth + 1) for k, v in value.items()})
        return (type(value).__name__, tuple(_snapshot(v, depth + 1) for v in value))
    if type(value) in (set, frozenset):
        return (type(value).__name__, frozenset(_Same(v) for v in value))
    return _Same(value)


def _digest(tensor: Any) -> bytes:
    """SHA-256 of a tensor's bytes (bit for bit, any dtype and device)."""
    import torch

    tensor = tensor.detach()
    if tensor.is_meta:
        return b"meta"
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    data = tensor.cpu().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy()).digest()


def _is_file(source: str) -> bool:
    return source.endswith(".py") or os.sep in source or "/" in source


def _import_file(spec: str, source: str, what: str = "port") -> Any:
    path = Path(source)
    if not path.is_file():
        raise InputError(f"{what} {spec!r}: no such file {source!r}")
    path = path.resolve()
    folder = str(path.parent)
    if folder in sys.path:  # as `python port.py` would: siblings import, its folder first
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    _forget_other_ports_siblings(folder)
    module_name = port_module_name(path)
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"{what} {spec!r}: cannot import {source!r} as Python")
    module = importlib.util.module_from_spec(loader_spec)
    imported_before = set(sys.modules)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up
    try:
        with port_code([spec], "while it was imported"):
            loader_spec.loader.exec_module(module)
    except PortStopped:
        sys.modules.pop(module_name, None)
        raise
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise _import_failed(spec, e, what) from e
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    finally:
        _note_siblings(set(sys.modules) - imported_before - {module_name}, folder)
    return module


def port_module_name(path: Path) -> str:
    """The module name a port file is imported under: its stem and a digest of its path."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    return f"_introspect_port_{stem}_{digest}"


# Modules a port file imported from its own folder (``helpers.py`` beside ``port.py``), by
# name -> that folder. Another port in another folder may have a sibling of the same name:
# it is forgotten from sys.modules before that port imports, so each gets its own.
_PORT_SIBLINGS: dict[str, str] = {}


def _note_siblings(names: set[str], folder: str) -> None:
    for name in names:
        file = getattr(sys.modules.get(name), "__file__", None)
        where = os.path.dirname(os.path.realpath(file)) if isinstance(file, str) else ""
        if where == folder or where.startswith(folder + os.sep):
            _PORT_SIBLINGS[name] = folder


def _forget_other_ports_siblings(folder: str) -> None:
    for name, owner in list(_PORT_SIBLINGS.items()):
        if owner != folder:
            sys.modules.pop(name, None)
            del _PORT_SIBLINGS[name]


def _import_module(spec: str, source: str, what: str = "port") -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:  # the user's repository, as `python -m` would see it
        sys.path.insert(0, cwd)
    try:
        with port_code([spec], "while it was imported"):
            return importlib.import_module(source)
    except PortStopped:
        raise
    except ModuleNotFoundError as e:
        if e.name and (source == e.name or source.startswith(e.name + ".")):
            raise InputError(f"{what} {spec!r}: no module named {source!r} "
                             f"(looked in {cwd} and the installed packages)") from e
        raise _import_failed(spec, e, what) from e
    except Exception as e:
        raise _import_failed(spec, e, what) from e


def _import_failed(spec: str, error: Exception, what: str = "port") -> Exception:
    if os.environ.get("INTROSPECT_DEBUG"):
        return error
    return InputError(f"{what} {spec!r} failed to import: {_one_line(error)}")


def _one_line(error: BaseException) -> str:
    """``RuntimeError: first line of the message`` (the type alone for an empty one)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}{': ' + message if message else ''}"


def _exit_described(error: BaseException) -> str:
    from introspect.models.guards import ProcessExitCalled

    if isinstance(error, ProcessExitCalled):
        return f"called os._exit({error.code!r})"
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    return f"raised {_one_line(error)}"


def _blamed(specs: Sequence[str], tb: TracebackType | None) -> str:
    """The port whose file a traceback goes through, deepest first; the first if none."""
    files = {}
    for spec in specs:
        source = spec.rpartition(":")[0]
        if _is_file(source):
            files[os.path.realpath(source)] = spec
        else:
            file = getattr(sys.modules.get(source), "__file__", None)
            if isinstance(file, str):
                files[os.path.realpath(file)] = spec
    frames = []
    while tb is not None:
        frames.append(os.path.realpath(tb.tb_frame.f_code.co_filename))
        tb = tb.tb_next
    for file in reversed(frames):
        if file in files:
            return files[file]
    return specs[0] if len(specs) == 1 else " or ".join(specs)


@contextlib.contextmanager
def _sigint_noted(interrupted: list[int]) -> Iterator[None]:
    """Note a real SIGINT (Ctrl-C) while the block runs; the previous handler still acts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # a handler set outside Python: leave it alone
        yield
        return

    def note(signum: int, frame: Any) -> None:
        interrupted.append(signum)
        if callable(previous):
            previous(signum, frame)  # default_int_handler raises KeyboardInterrupt
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
