"""What a module's run on the reference's inputs hands the judged modules inside it.

Module evidence sees no finer than the candidate's own modules: a block whose norm is a
custom op, NumPy or plain code between its Linears is judged as one block, on the block's
budget, and an RMSNorm eps of 1e-5 for 1e-6 there moved a 1.1B Llama's block by a tenth of
its budget more than its siblings' and passed. Yet the block's run on the reference's
inputs hands each of its judged submodules a value (the ``gate`` Linear's input), and the
pairing has found the reference value standing for it (the reference's
``post_attention_layernorm`` output): their gap is the local error of the code between the
block's inputs and that submodule, run on the reference's values, as a module of its own
would be judged. It is held to the same noise model (``budget``): 8x its noise (the same
run on inputs rounded once more) plus 16 roundings of the value's largest magnitude.

Where the block's own call took the reference's values bit for bit, that call is the run:
what it handed a submodule is what the capture kept as that submodule's input. Otherwise
the block's exact run (``local.exact_error``) is watched (``reuse.Reruns``). The noise run
is made only where a hand-over is over its floor (16 roundings: no noise can make the
budget smaller).

Only the first plain call's submodule calls are held (autograd on: every one of its calls
is judged, so each call's place among its module's calls inside the block is known), each
by that place: where the run calls a module another number of times than the plain call
did, nothing is said of it, nor of a module called in a worker thread (the threads' race
orders its calls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from introspect.diff.modules.arguments import value_at
from introspect.diff.modules.gaps import kept, largest, largest_gap
from introspect.diff.modules.pairing import Match, ModulePair
from introspect.run.capture import ModuleCall, whole_batch, wrapped
from introspect.run.truth import AUTOGRAD

HANDED = "what it hands"  # how a row failed by a hand-over begins its note


@dataclasses.dataclass
class HandOver:
    """One input of one judged submodule call inside the ancestor's call."""

    child: ModulePair
    match: Match  # the child's input and the reference value standing for it
    place: int  # its call's place among its module's calls inside the ancestor's call
    error: float = 0.0  # the handed value's largest gap to the reference's
    scale: float = 0.0  # the reference value's largest magnitude
    handed: torch.Tensor | None = None  # kept where over the floor (the noise run reads it)
    noise: float | None = None


class HandOvers:
    """The hand-overs of one ancestor's run to the judged calls inside it."""

    def __init__(self, ancestor: ModulePair, calls: Sequence[ModuleCall],
                 children: Sequence[ModulePair], real: torch.Tensor | None,
                 floor: float) -> None:
        self.real = real
        self.floor = floor  # roundings of a value's largest magnitude no budget is below
        outer = ancestor.call
        inside = [c for c in calls if _inside(c, outer)]
        self.totals: dict[int, int] = {}
        for call in inside:
            self.totals[id(call.module)] = self.totals.get(id(call.module), 0) + 1
        # a module called in a worker thread: its calls' order is the threads' race, in
        # the plain call and in the run alike, so no place tells which call is which
        threaded = {id(c.module) for c in inside if c.thread}
        self.expected: dict[int, list[HandOver]] = {}
        for child in children:
            call = child.call
            if child is ancestor or not _inside(call, outer) or id(call.module) in threaded:
                continue
            place = sum(1 for c in inside if c.module is call.module and c.started < call.started)
            for match in child.inputs:
                if match.path.startswith("args."):
                    self.expected.setdefault(id(call.module), []).append(
                        HandOver(child, match, place))
        self.counts: dict[int, int] = {}
        self.seen: list[HandOver] = []
        self._noise = False

    def expects(self) -> bool:
        return bool(self.expected)

    def start(self, noise: bool = False) -> None:
        """A run begins (``noise``: on the inputs rounded once more)."""
        self.counts.clear()
        self._noise = noise

    def saw(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        """A pre-hook's view of one call in the run (what it cannot read, it leaves: the
        run itself must never fail for it)."""
        try:
            self._saw(module, args)
        except Exception:  # noqa: BLE001  evidence not taken is never a failure
            return

    def _saw(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        key = id(module)
        expected = self.expected.get(key)
        if not expected:
            return
        place = self.counts.get(key, 0)
        self.counts[key] = place + 1
        for over in expected:
            if over.place != place or over.child.call.grad != torch.is_grad_enabled():
                continue
            try:
                value = value_at(list(args), {}, over.match.path)
            except (IndexError, KeyError, TypeError):
                continue
            if isinstance(value, torch.Tensor) and wrapped(value) \
                    and over.child.call.batched is not None:
                value = whole_batch(value)  # (a call under vmap, kept as the whole batch)
            if _comparable(value, over.match.boundary.value):
                self._hand(over, value.detach())

    def own_call(self) -> None:
        """The ancestor's own call was its run on the reference's values: what it handed
        each submodule is what the capture kept as that submodule's input."""
        self.start()
        for key, expected in self.expected.items():
            self.counts[key] = self.totals.get(key, 0)
            for over in expected:
                leaf = next((leaf for leaf in over.child.call.inputs
                             if leaf.path == over.match.path), None)
                if leaf is not None and leaf.unchanged() \
                        and _comparable(leaf.value, over.match.boundary.value):
                    self._hand(over, leaf.value)

    def finish(self) -> None:
        """The run ended: a module called another number of times than in the plain call
        says nothing (its places do not match); in the noise run, nor does its noise."""
        if self._noise:
            for over in self.seen:
                if not self._counted(over):
                    over.noise = None
            return
        self.seen = [over for over in self.seen if self._counted(over)]

    def _counted(self, over: HandOver) -> bool:
        key = id(over.child.call.module)
        return self.counts.get(key) == self.totals.get(key)

    def over_floor(self) -> list[HandOver]:
        return [over for over in self.seen if over.handed is not None]

    def _hand(self, over: HandOver, value: torch.Tensor) -> None:
        reference = over.match.boundary.value
        keep = kept(reference, value, self.real)
        if self._noise:
            if over.handed is not None:
                over.noise = largest_gap(value, over.handed, keep)
            return
        if any(o is over for o in self.seen):  # (by identity: a hand-over holds tensors)
            return
        over.error = largest_gap(value, reference, keep)
        over.scale = largest(reference, keep)
        if over.error > self.floor * over.scale:
            over.handed = value.clone()
        self.seen.append(over)


def _inside(call: ModuleCall, outer: ModuleCall) -> bool:
    """``call`` ran inside ``outer``'s call, in the first plain call (autograd on)."""
    return call is not outer and call.mode == outer.mode == AUTOGRAD \
        and outer.started >= 0 and call.started > outer.started and call.order < outer.order


def _comparable(value: Any, reference: torch.Tensor) -> bool:
    return type(value) is torch.Tensor and value.is_floating_point() \
        and value.layout == torch.strided and not wrapped(value) \
        and tuple(value.shape) == tuple(reference.shape) and value.device == reference.device


__all__ = ["HANDED", "HandOver", "HandOvers"]
