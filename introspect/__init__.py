"""introspect: see inside a HuggingFace BERT and prove that two implementations agree.

The public API is loaded lazily so that ``introspect --help`` starts without importing
torch (see ``__getattr__`` below)::

    import introspect
    graph = introspect.trace(model, inputs)      # IntrospectGraph
    result = introspect.diff(reference, candidate, inputs)   # DiffResult
"""

from __future__ import annotations

import sys
import types
from typing import Any

__version__ = "0.1.0"

# name -> "module:attribute"; imported on first use only.
_LAZY_API = {
    "trace": "introspect.graph:trace",
    "IntrospectGraph": "introspect.graph:IntrospectGraph",
    "load_model": "introspect.load:load_model",
    "tokenize": "introspect.load:tokenize",
    "diff": "introspect.diff.api:diff",
    "DiffResult": "introspect.diff.result:DiffResult",
}

# Subpackages reachable as attributes (``introspect.scratch.BertModel``), also lazily.
_LAZY_SUBMODULES = ("scratch", "render", "testing")

__all__ = ["__version__", *_LAZY_API, *_LAZY_SUBMODULES]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"introspect.{name}")
    if name not in _LAZY_API:
        raise AttributeError(f"module 'introspect' has no attribute {name!r}")
    module_name, attribute = _LAZY_API[name].split(":")
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """This package's module type: ``introspect.diff`` stays the function.

    The diff engine lives in the subpackage ``introspect/diff/``. Importing any of its
    modules makes Python set the attribute ``diff`` of this package to the subpackage,
    which would hide the function ``introspect.diff``; that one assignment is dropped (the
    subpackage stays in ``sys.modules``, so ``from introspect.diff.api import diff`` works).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "diff" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
