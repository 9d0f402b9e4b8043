"""A candidate module's local error: the module run on the reference's inputs to it.

The candidate's own call (``capture.ModuleCall``) is run again with each input that a
reference value stands for (``pairing.ModulePair``) replaced by that value, cast to the
candidate's dtype and device; its other arguments (a mask, a flag) are its own call's. It
runs under the grad mode its call ran under, so a branch on ``torch.is_grad_enabled()``
goes the way the user's call went. Its output is held against the reference's. A call
that took the reference's values bit for bit (the model's own call, on the same inputs) is
not run again for that: its own output is that run; nor is one run inside an ancestor's
run on exactly what its own run would be given (``reuse``): its output there is that run.

The same run on the reference's inputs moved by one rounding of the module's dtype
(``noise``) shows how much rounding at the module's inputs moves its output: the noise
model of ``budget``.

A module that cannot be run again cleanly (it raises, returns no tensor where it returned
one, or a value of another shape) is not compared; that is said, never failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from introspect.diff.modules.arguments import as_argument, copied, output_at, put, value_at
from introspect.diff.modules.gaps import kept, largest, largest_gap
from introspect.diff.modules.handovers import HandOvers
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.modules.reuse import Reruns
from introspect.run.capture import call_context
from introspect.run.truth import identical, keeping_nothing

# The unit roundoff of each dtype: one rounding of a value moves it by this much, relative.
UNIT = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
        torch.bfloat16: 2.0 ** -8}


class NotRerun(Exception):
    """The module could not be run again on the reference's inputs (why, in words)."""


@dataclasses.dataclass(frozen=True)
class Local:
    """The module's local error, its noise, and the reference output's largest magnitude."""

    max_abs: float
    noise: float | None  # None: not measured (the error was within ``floor`` already)
    scale: float
    elements: int


@dataclasses.dataclass(frozen=True)
class Exact:
    """The module's output run on the reference's inputs, and its gap to the reference's."""

    value: torch.Tensor
    keep: torch.Tensor  # the elements compared (``_kept``)
    error: float
    scale: float


def local_error(pair: ModulePair, unit: float, real: torch.Tensor | None = None,
                floor: float = 0.0, reruns: Reruns | None = None) -> Local:
    """Run the candidate module on the reference's inputs (and once more on them rounded
    once more) and measure its output against the reference's: ``exact_error``, then
    ``with_noise``.

    ``real``: the attention mask (B, S); outputs laid out (B, S, ...) are compared at real
    tokens only. ``floor``: an error at most ``floor`` times the output's largest magnitude
    is within any budget the noise could give (``budget.FLOOR_UNITS`` roundings): the second
    run is left out (most modules of a close port after a fault upstream). ``reruns``: the
    outputs the exact runs of its ancestors gave it (``reuse``; its own exact run feeds its
    submodules'). Raises ``NotRerun``.
    """
    return with_noise(pair, unit, exact_error(pair, real, reruns), floor)


def exact_error(pair: ModulePair, real: torch.Tensor | None = None,
                reruns: Reruns | None = None, handing: HandOvers | None = None) -> Exact:
    """The candidate module's output on the reference's inputs (its own call's where that
    took them bit for bit, an ancestor's run's where it gave it them, else a run of its
    own) and its largest gap to the reference's output; with ``handing``, what that run
    handed the judged calls inside it. Raises ``NotRerun``."""
    reference = pair.output.boundary.value
    path = pair.output.path
    seen = reruns.take(pair) if reruns is not None else None
    exact = _own_output(pair)
    if exact is not None and handing is not None:
        handing.own_call()
    if exact is None and seen is not None:
        exact, handing = seen, None  # (not run: nothing handed that can be told)
    if exact is None:
        if handing is not None:
            handing.start()
        with reruns.watching(pair.call.module, handing) if reruns is not None \
                else nullcontext():
            exact = _rerun(pair, path, lambda t: t)
    if handing is not None:
        handing.finish()
    keep = kept(reference, exact, real)
    return Exact(exact, keep, largest_gap(exact, reference, keep), largest(reference, keep))


def within_floor(exact: Exact, floor: float) -> bool:
    """An error no budget can be below (``floor`` roundings of the output's magnitude)."""
    return exact.error <= floor * exact.scale


def with_noise(pair: ModulePair, unit: float, exact: Exact, floor: float = 0.0,
               inference: bool = False) -> Local:
    """``exact`` with the module's noise: its run on the reference's inputs rounded once
    more, against ``exact`` (left out where the error is within ``floor``)."""
    if within_floor(exact, floor):
        return Local(exact.error, None, exact.scale, int(exact.keep.sum()))
    moved = _rerun(pair, pair.output.path, _rounding(unit), inference=inference)
    return Local(exact.error, largest_gap(moved, exact.value, exact.keep), exact.scale,
                 int(exact.keep.sum()))


def handed_noise(pair: ModulePair, unit: float, reruns: Reruns,
                 handing: HandOvers) -> None:
    """The noise of what ``pair``'s module hands the calls inside it, where a hand-over
    is over its floor: its run on the reference's inputs rounded once more, watched.
    Raises ``NotRerun``."""
    if not handing.over_floor():
        return
    handing.start(noise=True)
    with reruns.watching(pair.call.module, handing, reuse=False):
        _rerun(pair, pair.output.path, _rounding(unit))
    handing.finish()


def _rounding(unit: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Each input rounded once more: moved by one ``unit``, a random sign per element (the
    same signs in every run)."""
    generator = torch.Generator().manual_seed(0)

    def rounded(t: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, t.shape, generator=generator).to(t.device) * 2 - 1
        return t * (1 + unit * signs.to(t.dtype))

    return rounded


def inference_local(pair: ModulePair, unit: float, real: torch.Tensor | None = None,
                    floor: float = 0.0) -> Local:
    """``local_error`` with both runs under ``torch.inference_mode()`` (a branch on
    ``torch.is_inference_mode_enabled()`` that no captured call took). Raises
    ``NotRerun``."""
    reference = pair.output.boundary.value
    value = _rerun(pair, pair.output.path, lambda t: t, inference=True)
    keep = kept(reference, value, real)
    exact = Exact(value, keep, largest_gap(value, reference, keep), largest(reference, keep))
    return with_noise(pair, unit, exact, floor, inference=True)


def _rerun(pair: ModulePair, path: str, change: Callable[[torch.Tensor], torch.Tensor],
           inference: bool = False) -> torch.Tensor:
    call = pair.call
    module: Any = call.module
    if call.batched is not None:  # called under vmap: mapped over the same arguments again
        dims = tuple(0 if i in call.batched else None for i in range(len(call.held_args)))

        def module(*given: Any, **named: Any) -> Any:
            return torch.func.vmap(lambda *a: call.module(*a, **named), in_dims=dims)(*given)

    def run() -> Any:
        # copies, made for each run (``keeping_nothing`` may run it twice): a kept value
        # (its own call's, or the reference's it was kept as, ``capture``) stays as it
        # was, whatever the module does to its arguments when run again
        args: Any = [copied(a) for a in call.args]
        kwargs = {k: copied(v) for k, v in call.kwargs.items()}
        for match in pair.inputs:
            value = as_argument(match.boundary.value, value_at(args, kwargs, match.path))
            put(args, kwargs, match.path, change(value))
        return module(*args, **kwargs)

    try:
        mode = torch.inference_mode() if inference else torch.set_grad_enabled(call.grad)
        with mode, call_context(call):  # (its own hooks too: the capture took what they returned)
            returned = keeping_nothing(run)
    except Exception as e:  # noqa: BLE001  any failure: not compared, said why
        raise NotRerun(f"it raised {type(e).__name__} when run again") from e
    out = output_at(returned, path)
    if not isinstance(out, torch.Tensor):
        raise NotRerun("run again, it returned no tensor where its call returned one")
    wanted = pair.output.boundary.value.shape
    if call.batched is not None and out.numel() == pair.output.boundary.value.numel():
        out = out.reshape(wanted)  # (B, 1, S, H) for (B, S, H): one row per map
    if tuple(out.shape) != tuple(wanted):
        raise NotRerun("run again, it returned a value of another shape")
    return out.detach()


def _own_output(pair: ModulePair) -> torch.Tensor | None:
    """Its own call's output where that call took the reference's values bit for bit: run
    on them, the module is that call (the model's own call, or a first layer's: no run)."""
    call = pair.call
    taken = {leaf.path: leaf for leaf in call.inputs}
    for match in pair.inputs:
        leaf = taken.get(match.path)
        value = match.boundary.value
        if leaf is None or not leaf.unchanged() or leaf.value.device != value.device \
                or not identical(leaf.value, value):
            return None
    own = next((leaf for leaf in call.outputs if leaf.path == pair.output.path), None)
    return own.value if own is not None and own.unchanged() else None


__all__ = ["UNIT", "Exact", "Local", "NotRerun", "exact_error", "handed_noise", "inference_local",
           "local_error", "with_noise", "within_floor"]

