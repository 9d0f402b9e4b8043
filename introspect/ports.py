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
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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


def resolve_builder(spec: str) -> Callable[[LoadedReference], Any]:
    """Import the callable a spec names, without calling it.

    Raises:
        InputError: the file or module is missing or fails to import, it has no such
            attribute, or the attribute is not callable.
    """
    source, _, name = spec.rpartition(":")
    if not is_port_spec(spec):
        raise InputError(f"port {spec!r}: expected path/to/port.py:NAME or package.module:NAME")
    module = _import_file(spec, source) if _is_file(source) else _import_module(spec, source)
    target: Any = module
    for part in name.split("."):  # build or Class.build
        if not hasattr(target, part):
            raise InputError(f"port {spec!r}: {source} has no attribute {name!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"port {spec!r}: {name} is a {type(target).__name__}, not a callable "
                         "that takes the loaded reference and returns an nn.Module")
    return target  # type: ignore[no-any-return]


def build_port(spec: str, builder: Callable[[LoadedReference], Any],
               reference: LoadedReference) -> Any:
    """Call the builder on the reference; the ``nn.Module`` it returns.

    Raises:
        InputError: the builder raises, or returns something that is not an ``nn.Module``.
    """
    import torch

    try:
        model = builder(reference)
    except Exception as e:  # the user's code: any failure is a bad candidate, said in one line
        if os.environ.get("INTROSPECT_DEBUG"):
            raise
        message = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InputError(f"port {spec!r} raised {type(e).__name__}"
                         f"{': ' + message if message else ''}") from e
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"port {spec!r} returned a {type(model).__name__}, not a "
                         "torch.nn.Module")
    return model


def _is_file(source: str) -> bool:
    return source.endswith(".py") or os.sep in source or "/" in source


def _import_file(spec: str, source: str) -> Any:
    path = Path(source)
    if not path.is_file():
        raise InputError(f"port {spec!r}: no such file {source!r}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # as `python port.py` would: siblings import
        sys.path.insert(0, folder)
    module_name = f"_introspect_port_{path.stem}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"port {spec!r}: cannot import {source!r} as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise _import_failed(spec, e) from e
    return module


def _import_module(spec: str, source: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path:  # the user's repository, as `python -m` would see it
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(source)
    except ModuleNotFoundError as e:
        if e.name and (source == e.name or source.startswith(e.name + ".")):
            raise InputError(f"port {spec!r}: no module named {source!r} "
                             f"(looked in {cwd} and the installed packages)") from e
        raise _import_failed(spec, e) from e
    except Exception as e:
        raise _import_failed(spec, e) from e


def _import_failed(spec: str, error: Exception) -> Exception:
    if os.environ.get("INTROSPECT_DEBUG"):
        return error
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return InputError(f"port {spec!r} failed to import: {type(error).__name__}"
                      f"{': ' + message if message else ''}")
