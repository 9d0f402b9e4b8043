"""Values at module boundaries of a plain call: where a recording parts from the truth.

The recording (``introspect.diff.ops.eager``) runs the model under a torch function mode, and
any mode switches off PyTorch's fast paths: ``nn.TransformerEncoderLayer`` in eval under
``no_grad`` runs one fused kernel that reads ``linear1.weight`` itself and never calls
``linear1``'s forward. Where a recording does not reproduce the plain call, this module
says from which module on: it runs the model twice under ``no_grad``, once plainly and
once under a mode that only passes every call through, and takes each module's output
with a *global* forward hook (``register_module_forward_hook``). Per-module hooks would
switch the fast path off too; a global hook does not, and a module that a fast path skips
simply reports nothing. The first module, in the order modules finish, whose outputs
differ between the two runs is the deepest that really ran where the paths part.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from introspect.run.outputs import flatten_outputs
from introspect.run.truth import identical


class _OtherThreads(Exception):
    """A module called in a worker thread: no call's number says which call it is."""


class _PassThrough(TorchFunctionMode):
    """A mode that changes nothing but being there (as the recorder is)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def module_outputs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                   keywords: Mapping[str, Any] | None = None, *,
                   under_mode: bool = False) -> dict[tuple[str, int], torch.Tensor]:
    """Each module call's first output tensor, by (module name, call number), in the
    order the calls finished.

    Raises:
        _OtherThreads: a module was called in another thread than the caller's: its
            calls are numbered in the order threads happen to run them, which two runs
            need not share (probe round p: rows in worker threads named a layer where
            nothing differed).
    """
    names = {id(m): name for name, m in model.named_modules()}
    calls: dict[str, int] = {}
    taken: dict[tuple[str, int], torch.Tensor] = {}
    caller = threading.get_ident()
    elsewhere: list[str] = []  # the modules called in another thread

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        name = names.get(id(module))
        if name is None:
            return
        if threading.get_ident() != caller:  # (said after the call: raised here, in a
            elsewhere.append(name)  # worker, a port waiting on its result might hang)
            return
        leaves = flatten_outputs(output)
        if not leaves:
            return
        number = calls.get(name, 0)
        calls[name] = number + 1
        taken[(name, number)] = next(iter(leaves.values()))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    copies = {name: tensor.clone() for name, tensor in inputs.items()}
    try:
        with torch.no_grad():
            if under_mode:
                with _PassThrough():
                    model(**copies, **(keywords or {}))
            else:
                model(**copies, **(keywords or {}))
    finally:
        handle.remove()
    if elsewhere:
        raise _OtherThreads(elsewhere[0])
    return taken


def where_paths_part(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                     keywords: Mapping[str, Any] | None = None,
                     ) -> tuple[str, str, float] | None:
    """The first module whose plain output differs from its output under a mode.

    Returns:
        (module name, its class name, the largest difference), or None where every module
        both runs report gives the same values (or the model fails to run again, or calls
        its modules in worker threads: two runs need not number their calls alike).
    """
    try:
        plain = module_outputs(model, inputs, keywords)
        moded = module_outputs(model, inputs, keywords, under_mode=True)
        return _first_parting(model, plain, moded)
    except Exception:  # the question is a detail of a note: never a new failure (a
        return None  # module's value under vmap, say, has no storage to compare)


def _first_parting(model: torch.nn.Module, plain: Mapping[Any, torch.Tensor],
                   moded: Mapping[Any, torch.Tensor]) -> tuple[str, str, float] | None:
    modules = dict(model.named_modules())
    first: tuple[str, str, float] | None = None
    for (name, _), value in plain.items():
        other = moded.get((name, _))
        if other is None or identical(value, other):
            continue
        gap, scale = _gap(value, other)
        found = (name or type(model).__name__, type(modules[name]).__name__, gap)
        # A fused kernel rounds otherwise than the Python code it replaces: the paths
        # part where the difference is more than rounding (or, failing that, first).
        if not gap <= ROUNDING * scale + ROUNDING_ATOL:
            return found
        first = first or found
    return first


def reference_module(module: str, relations: Iterable[tuple[str, str]]) -> str:
    """The reference's module that owns the weights the candidate's ``module`` owns.

    ``where_paths_part`` names the candidate's module (``encoder.layers.1``); a user reads
    the reference's (``encoder.layer.1``). ``relations``: (candidate parameter, reference
    parameter) pairs the aligner related by value. Returns the reference modules' longest
    common path, or "" where none of the module's weights relates to the reference's.
    """
    prefix = f"{module}." if module else ""
    owners = [reference.rpartition(".")[0] for candidate, reference in relations
              if candidate.startswith(prefix)]
    if not owners:
        return ""
    common = owners[0].split(".")
    for owner in owners[1:]:
        parts = owner.split(".")
        length = 0
        while length < min(len(common), len(parts)) and common[length] == parts[length]:
            length += 1
        common = common[:length]
    return ".".join(common)


# What rounding explains between a fused kernel and the code it replaces (float32): the
# drift model's relative limit (``introspect.diff.ops.drift.DRIFT_RTOL``) and fp32's atol.
ROUNDING = 1e-4
ROUNDING_ATOL = 1e-5


def _gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The largest difference of two values and the first's largest magnitude."""
    if a.shape != b.shape or not a.numel():
        return float("nan"), 0.0
    a64, b64 = a.double(), b.double()
    return float((a64 - b64).abs().nan_to_num(float("inf")).max()), \
        float(a64.abs().nan_to_num(0).max())


__all__ = ["module_outputs", "reference_module", "where_paths_part"]
