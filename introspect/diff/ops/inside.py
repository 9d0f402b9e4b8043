"""Op evidence inside one module: the smallest module that module evidence fails, recorded
and replayed alone (shared/DESIGN.md "Evidence that holds": record and replay only inside
a module whose evidence fails).

A FAIL that module evidence proves needs no recording of either model to stand; the
recording only says which op inside the failing module parts, and why. So each side's
module is recorded on its own, on the values module evidence judged it on: the
reference's module on the arguments of its own plain call, the candidate's on the
reference's values its inputs were paired with (``modules.local``'s rerun, its other
arguments its own call's). Both are held in a ``_Holder`` at their paths in their models,
so every node keeps the name and module path it has in a recording of the whole model,
and the hypotheses read the whole models as they do after a full recording.

The scope is used only where it is faithful: the reference module recorded must return
what its plain call returned, bit for bit; anything else gives None (the full recording).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from introspect.diff.modules.arguments import as_argument, mapped, output_at
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.ops.explain import Explanation, record_for_diff
from introspect.run.capture import ModuleCall
from introspect.run.truth import identical, same_view

OUTPUT = "output"  # the one output each holder returns: the pair's compared value


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where a named input goes in a call's arguments."""

    name: str


class _Holder(torch.nn.Module):
    """``module`` at ``path`` (empty modules above it), called on fixed arguments with the
    named tensors in their slots; returns one output: the value at ``output`` (``local``'s
    path syntax: "output", "output.0", "output.last_hidden_state") in what ``returner``
    returned (``path`` itself, or a module inside it called once in the call)."""

    def __init__(self, module: torch.nn.Module, path: str, template: tuple[Any, Any],
                 output: str, returner: str = "") -> None:
        super().__init__()
        parent: torch.nn.Module = self
        *outer, last = path.split(".")
        for part in outer:
            child = torch.nn.Module()
            parent.add_module(part, child)
            parent = child
        parent.add_module(last, module)
        self._path, self._template, self._output = path, template, output
        self._returner = returner or path

    def forward(self, **tensors: torch.Tensor) -> dict[str, Any]:
        args, kwargs = _filled(self._template, tensors)
        module = self.get_submodule(self._path)
        if self._returner == self._path:
            return {OUTPUT: output_at(module(*args, **kwargs), self._output)}
        seen: list[Any] = []
        hook = self.get_submodule(self._returner).register_forward_hook(
            lambda _module, _args, returned: seen.append(returned))
        try:
            module(*args, **kwargs)
        finally:
            hook.remove()
        if len(seen) != 1:
            raise RuntimeError(f"{self._returner} ran {len(seen)} times in {self._path}")
        return {OUTPUT: output_at(seen[0], self._output)}


@dataclasses.dataclass(frozen=True)
class Scope:
    """Both sides' holders and the inputs each is recorded on."""

    module: str  # the reference's module
    candidate_module: str
    reference: _Holder
    candidate: _Holder
    ref_inputs: dict[str, torch.Tensor]
    cand_inputs: dict[str, torch.Tensor]
    expected: torch.Tensor  # what the reference module returned in its plain call
    # the candidate's inputs that are its own call's values, paired with none of the
    # reference's (a mask, a flag): what its model computed outside the module
    own_inputs: tuple[str, ...] = ()

    @property
    def computed_alone(self) -> bool:
        """The candidate's module takes the reference's values only: what it computes
        depends on nothing its model computed outside it (``DivergenceContext.scope``)."""
        return not self.own_inputs


def scope_of(pair: ModulePair, ref_call: ModuleCall, returner: ModuleCall) -> Scope | None:
    """The scope of a failing pair: ``pair.call`` (the candidate's), ``ref_call`` (the
    reference module that took the values standing for its inputs) and ``returner`` (the
    call in it that returned the value standing for its output); None where the values
    cannot be placed (an argument edited in place since, a module at the model's root)."""
    if not pair.call.name or not ref_call.name or ref_call.edited_inputs \
            or pair.call.edited_inputs:
        return None
    expected = pair.output.boundary.value
    ref_output = next((leaf.path for leaf in returner.outputs
                       if leaf.unchanged() and same_view(leaf.value, expected)), None)
    if ref_output is None or not all(leaf.unchanged() for leaf in ref_call.inputs):
        return None
    names: dict[str, str] = {}  # the reference's argument path -> input name
    ref_inputs: dict[str, torch.Tensor] = {}
    for leaf in ref_call.inputs:
        names[leaf.path] = _name(leaf.path)
        ref_inputs[names[leaf.path]] = leaf.value.clone()
    paired = {m.path: m for m in pair.inputs}
    cand_names: dict[str, str] = {}
    cand_inputs: dict[str, torch.Tensor] = {}
    own: list[str] = []
    for leaf in pair.call.inputs:
        if not leaf.unchanged():
            return None
        match = paired.get(leaf.path)
        if match is None:  # its own value (a mask, a flag): as its own call had it
            name, value = f"own_{_name(leaf.path)}", leaf.value.clone()
            own.append(name)
        else:  # the reference's value it was paired with, in its dtype and place
            value = as_argument(match.boundary.value, leaf.value)
            same = next((p for p in ref_call.inputs
                         if same_view(p.value, match.boundary.value)), None)
            name = names[same.path] if same is not None else f"own_{_name(leaf.path)}"
        cand_names[leaf.path] = name
        cand_inputs[name] = value
    return Scope(ref_call.name, pair.call.name,
                 _Holder(ref_call.module, ref_call.name,
                         _template(ref_call.args, ref_call.kwargs, names), ref_output,
                         returner.name),
                 _Holder(pair.call.module, pair.call.name,
                         _template(pair.call.args, pair.call.kwargs, cand_names),
                         pair.output.path),
                 ref_inputs, cand_inputs, expected, tuple(own))


def explain_scope(scope: Scope, explain_with: Callable[..., Explanation],
                  reference_label: str) -> tuple[Any, Explanation] | None:
    """The reference's side (``record_for_diff``'s) and the explanation inside ``scope``
    (``explain_with(ref_side, candidate, inputs)``: ``ops.explain.explain`` with the diff's
    other arguments), or None where the scoped reference recording does not return what
    the module's plain call did, or the candidate's cannot be recorded or replayed."""
    try:
        ref_side = record_for_diff(scope.reference, dict(scope.ref_inputs), reference_label)
    except Exception:  # noqa: BLE001  it cannot be recorded alone: the full recording
        return None
    recorded = ref_side[2].recorded_outputs.get(OUTPUT)
    if not isinstance(recorded, torch.Tensor) or not identical(recorded, scope.expected):
        return None
    explanation = explain_with(ref_side, scope.candidate, dict(scope.cand_inputs))
    if explanation.graph is None or explanation.unfaithful:
        return None
    return ref_side, explanation


def _name(path: str) -> str:
    return path.replace(".", "_")


def _template(args: tuple[Any, ...], kwargs: Mapping[str, Any],
              names: Mapping[str, str]) -> tuple[Any, Any]:
    """The call's arguments with each named tensor a ``_Slot`` (paths as ``capture``'s)."""
    return (_slotted(list(args), "args", names), _slotted(dict(kwargs), "kwargs", names))


def _slotted(value: Any, path: str, names: Mapping[str, str]) -> Any:
    def slot(leaf: Any, at: str) -> Any:  # a copy: a module editing it leaves the kept one
        if not isinstance(leaf, torch.Tensor):
            return leaf
        return _Slot(names[at]) if at in names else leaf.detach().clone()

    return mapped(value, slot, path)


def _filled(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    return mapped(value, lambda leaf, _: tensors[leaf.name] if isinstance(leaf, _Slot) else leaf)


__all__ = ["OUTPUT", "Scope", "explain_scope", "scope_of"]
