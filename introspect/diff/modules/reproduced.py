"""Where a forward that changes from call to call changes: the smallest module whose call,
run again on its own inputs, does not return what it returned.

A port wrong on its first call only (a lazy init, a counter) fails its truth runs ("its
forward changes from call to call"), but module evidence runs each module again on the
reference's inputs, a later call, which is right: every module passes, and the FAIL named
only the outputs. Here each module of the first call with autograd on is run again on its
own captured inputs, under that call's grad mode, its own forward hooks left out as the
capture saw it; one that returns other values holds the change. The search walks down
from the model: a module is run only where its parent did not reproduce, so it costs about
one forward per level, and it runs only for a forward that changed between calls.

Example::

    >>> call, gap = first_unreproduced(candidate_calls.of_mode(AUTOGRAD))
    >>> call.name
    'blocks.1'
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from introspect.diff.modules.arguments import copied, output_at
from introspect.run.capture import ModuleCall, call_context
from introspect.run.truth import identical


def first_unreproduced(calls: Sequence[ModuleCall], inference: bool = False,
                       ) -> tuple[ModuleCall, float] | None:
    """The deepest module call, first in call order, that does not reproduce its output
    run again on its own inputs, below the model's own call, and the largest difference
    (None: each reproduces, or none can be run again). ``inference``: run again under
    ``torch.inference_mode()`` (a forward whose outputs are wrong there only: a branch on
    ``torch.is_inference_mode_enabled()``, which no kept call ran)."""
    names = {c.name for c in calls}
    root = next((c for c in calls if c.name == ""), None)
    gap = _gap(root, inference) if root is not None else None
    if root is None or gap is None:
        return None
    found = (root, gap)
    while True:
        outer = found[0]
        inside = sorted((c for c in calls if _called_parent(c.name, names) == outer.name
                         and c is not outer and _within(c, outer)),
                        key=lambda c: c.started if c.started >= 0 else c.order)
        changing = next(((c, g) for c in inside if (g := _gap(c, inference)) is not None),
                        None)
        if changing is None:
            return None if outer.name == "" else found
        found = changing


def _gap(call: ModuleCall, inference: bool = False) -> float | None:
    """Run again on its own inputs, how far ``call``'s module's output is from its first
    (None where it returns it bit for bit, or cannot be asked: nothing to hold it to, or
    it raises)."""
    mine = next((leaf for leaf in call.outputs if leaf.unchanged()), None)
    if mine is None or call.edited_inputs or call.thread:
        return None
    try:
        mode = torch.inference_mode() if inference else torch.set_grad_enabled(call.grad)
        with mode, call_context(call):
            returned = call.module(*copied(list(call.args)), **copied(call.kwargs))
            again = output_at(returned, mine.path)
            again = again.clone() if isinstance(again, torch.Tensor) else again
    except Exception:  # noqa: BLE001  (the question is where, not whether: no new failure)
        return None
    if not isinstance(again, torch.Tensor) or identical(again.detach(), mine.value):
        return None
    if again.shape != mine.value.shape:
        return math.inf
    return float((again.detach().double() - mine.value.double()).abs().nan_to_num(
        math.inf).max())


def _called_parent(name: str, names: set[str]) -> str | None:
    """The nearest enclosing module that was called itself (a ``ModuleList`` never is)."""
    if not name:
        return None
    parent = name
    while parent:
        parent = parent.rpartition(".")[0]
        if parent in names:
            return parent
    return ""


def _within(call: ModuleCall, outer: ModuleCall) -> bool:
    """``call`` ran inside ``outer``'s call (it started after it and finished before)."""
    if call.started < 0 or outer.started < 0:
        return True
    return outer.started < call.started and call.order < outer.order


__all__ = ["first_unreproduced"]
