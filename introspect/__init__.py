"""introspect: see inside a HuggingFace BERT and prove that two implementations agree.

The public API is loaded lazily so that ``introspect --help`` starts without importing
torch (see ``__getattr__`` below); type checkers read the real signatures from the
``TYPE_CHECKING`` imports::

    import introspect
    graph = introspect.trace(model, inputs)      # IntrospectGraph
    result = introspect.diff(reference, candidate, inputs)   # DiffResult
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from introspect.version import __version__

if TYPE_CHECKING:  # what mypy and pyright see; at run time __getattr__ imports on first use
    from collections.abc import Mapping

    import torch

    from introspect import render, scratch, testing
    from introspect.attention.heads import HeadParity
    from introspect.attention.maps import AttentionMaps
    from introspect.diff.api import diff
    from introspect.diff.records import Divergence
    from introspect.diff.result import DiffResult
    from introspect.graph import IntrospectGraph, trace
    from introspect.models.load import LoadedModel, TokenizedInputs, load_model, tokenize


class _AttentionPackage:
    """``introspect.attention`` as type checkers see it: ``compare_heads``, ``attention`` and,
    called, ``introspect.attention.maps.attention``. Declared with full signatures (a test
    holds them equal to the real ones): pyright infers nothing from an installed package."""

    @staticmethod
    def compare_heads(reference: torch.nn.Module, candidate: torch.nn.Module,
                      inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
                      atol: float | None = None, rtol: float | None = None,
                      local: bool = True) -> HeadParity:
        raise NotImplementedError  # never called: introspect.attention is the package

    @staticmethod
    def attention(model: torch.nn.Module, inputs: TokenizedInputs | Mapping[str, torch.Tensor],
                  *, title: str = "") -> AttentionMaps:
        raise NotImplementedError

    def __call__(self, model: torch.nn.Module,
                 inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
                 title: str = "") -> AttentionMaps:
        raise NotImplementedError


if TYPE_CHECKING:
    attention: _AttentionPackage

# name -> "module:attribute"; imported on first use only.
_LAZY_API = {
    "trace": "introspect.graph:trace",
    "IntrospectGraph": "introspect.graph:IntrospectGraph",
    "load_model": "introspect.models.load:load_model",
    "tokenize": "introspect.models.load:tokenize",
    "LoadedModel": "introspect.models.load:LoadedModel",
    "TokenizedInputs": "introspect.models.load:TokenizedInputs",
    "diff": "introspect.diff.api:diff",
    "DiffResult": "introspect.diff.result:DiffResult",
    "Divergence": "introspect.diff.records:Divergence",
    "AttentionMaps": "introspect.attention:AttentionMaps",
    "HeadParity": "introspect.attention:HeadParity",
}

# Subpackages reachable as attributes (``introspect.scratch.BertModel``), also lazily.
_LAZY_SUBMODULES = ("scratch", "render", "testing", "attention")  # attention is callable

# Spelled out (not built from the two above) so that linters and type checkers read it.
__all__ = ["__version__", "trace", "IntrospectGraph", "load_model", "tokenize", "LoadedModel",
           "TokenizedInputs", "diff", "DiffResult", "Divergence", "attention", "AttentionMaps",
           "HeadParity", "scratch", "render", "testing"]


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


_FUNCTIONS_NAMED_LIKE_PACKAGES = ("diff",)


class _Package(types.ModuleType):
    """This package's module type: ``introspect.diff`` stays the function.

    The diff engine lives in the subpackage ``introspect/diff/``. Importing any of its
    modules makes Python set the attribute ``diff`` of this package to the subpackage,
    which would hide the function; that one assignment is dropped (the subpackage stays in
    ``sys.modules``, so ``from introspect.diff.api import diff`` works). The tracer's
    package is ``introspect/tracing/``, named apart from the function ``introspect.trace``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FUNCTIONS_NAMED_LIKE_PACKAGES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    """The public API (loaded or not) and the module's own names, for dir() and completion."""
    return sorted({*globals(), *__all__})
