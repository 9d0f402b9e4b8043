"""A module pair run again in float64: a slip that rounding cannot hide.

A module's float32 budget (``budget``) has to hold every way a correct port rounds (its
sums regrouped, a norm written by hand), so a slip of a few times its rounding noise (an
RMSNorm's eps 1e-5 for 1e-6 deep in a model: 5.7e-6 against a budget of 1e-5) passes
there. Run in float64, the rounding that budget holds is gone and the slip is not: both
modules are run again on the same inputs (the reference's own, exactly), every op's
floating arguments, the dtypes it is asked for and its results held in float64
(``_InFloat64``); the candidate's output there is held against the reference's, against a
budget of the reference's own float32 error (how far its float32 output, the one the hooks
saw, is from its float64 one): ``CONFIRM_FACTOR`` times that, plus ``CONFIRM_UNITS``
float32 roundings of the output's largest magnitude (a quantity one side computes and the
other is handed rounded: a rotary table).

Its largest gap is not all it holds. Rounding moves most elements by a fraction of a
rounding, and its largest is one element's bad luck; a slip moves every element by its
share (a GELU's 1/sqrt(2) typed 0.70711, SiLU's e typed 2.7183, an RMSNorm's eps 3e-6 for
1e-6), so its mean gap stands near its largest while rounding's does not. So the mean gap
over the same elements is held against ``MEAN_FACTOR`` times the reference's own mean
float32 error, plus ``MEAN_UNITS`` float32 roundings of the output's mean magnitude: a pair
fails where either is over. Measured on about a hundred correct ports and ten such
slips (``docs/verdict.md``): correct ports' mean gaps are at most 0.8 of the reference's
mean error (a Llama at 1,500 tokens, whose float32 ``inv_freq`` is rounded data the other
side computes), the slips' at least 2.5 of it, where their largest gaps are 1.6x to 4x.

The check only adds a FAIL to a pair that passed its float32 budget, never a PASS (a fault
that lives in float32 alone, a softmax rounded to bfloat16, is gone in float64 and judged
by the float32 budget), and only where it proves something: where either run saw an op
writing into a value of less than float64, a value rounded coarser than float32, an
autocast region, or the run raises, it says nothing (``None``).

A candidate may compute part of its run in float32 where the mode cannot reach: an
*island* (NumPy in float32, a worker thread, a constant kept in float32, a custom op that
casts inside). Its values are taken up as they come, and it rounds there as it did in
float32, once, as the reference's own float32 run rounds the same computation. So where
the candidate's run holds an island, the budget is over the larger of the two float32
errors, the reference's and the candidate's own (its float32 output on the same inputs
against its float64 one, which holds a NumPy LayerNorm's cancellation as it rounds). The
reference's run must hold none: its float64 output is the truth the budget stands on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from introspect.diff.modules.arguments import as_argument, copied, output_at, put, value_at
from introspect.diff.modules.folds import exact_in_float64
from introspect.diff.modules.gaps import kept, largest, largest_gap, mean_gap, mean_magnitude
from introspect.diff.modules.local import UNIT
from introspect.diff.modules.pairing import ModulePair, view_key
from introspect.diff.modules.view_of import as_viewed, views_into
from introspect.run.capture import ModuleCall
from introspect.run.outputs import flatten_outputs
from introspect.run.truth import keeping_nothing

# The float32 budget's share over which a passing pair is run again in float64: correct
# ports measure at most 0.23 of it (``budget``'s calibration), so they are not run again.
CONFIRM_SHARE = 0.25
CONFIRM_FACTOR = 4.0
CONFIRM_UNITS = 2.0
IN_FLOAT64 = "run again in float64"  # how a row failed here begins its note
# The mean gap's budget: this many times the reference's own mean float32 error, plus this
# many float32 roundings of the output's mean magnitude (``Float64Check.mean_limit``).
MEAN_FACTOR = 1.5
MEAN_UNITS = 1.0
# how the note of a row failed on its mean gap goes on after ``IN_FLOAT64``
ON_AVERAGE = "the candidate's output is on average"

_HIGHER = {torch.float32: torch.float64, torch.float16: torch.float64,
           torch.bfloat16: torch.float64, torch.complex64: torch.complex128,
           torch.complex32: torch.complex128}


@dataclasses.dataclass(frozen=True)
class Float64Check:
    """The pair's outputs run again in float64, and what rounding explains of their gap."""

    error: float  # the candidate's float64 output against the reference's
    reference_error: float  # the reference's float32 output against its float64 one
    limit: float
    island: str = ""  # the candidate's first value rounded in float32 where the mode is not
    candidate_error: float = 0.0  # (an island's) its float32 output against its float64
    # the same, as means over the compared elements, and the mean gap's budget
    mean_error: float = 0.0
    reference_mean: float = 0.0
    candidate_mean: float = 0.0
    mean_limit: float = math.inf

    @property
    def failed(self) -> bool:
        return self.error > self.limit or self.mean_error > self.mean_limit

    @property
    def on_average(self) -> bool:
        """Failed on its mean gap alone: its largest is within its budget."""
        return self.error <= self.limit and self.mean_error > self.mean_limit

    @property
    def shown(self) -> tuple[float, float]:
        """The gap and the budget a row shows: the mean's where it failed on the mean."""
        return (self.mean_error, self.mean_limit) if self.on_average \
            else (self.error, self.limit)

    @property
    def badness(self) -> float:
        """How far over its budgets, the worse of the two (over 1: failed)."""
        return max(_over(self.error, self.limit), _over(self.mean_error, self.mean_limit))

    @property
    def why(self) -> str:
        if self.on_average:
            own = (f"the larger mean float32 error, the reference's "
                   f"{self.reference_mean:.2g} or the candidate's own "
                   f"{self.candidate_mean:.2g}" if self.island else
                   f"the reference's own mean float32 error {self.reference_mean:.2g}")
            return (f"{IN_FLOAT64} on the same inputs, {ON_AVERAGE} {self.mean_error:.3g} "
                    f"from the reference's (budget {self.mean_limit:.3g}: {MEAN_FACTOR:g}x "
                    f"{own} + {MEAN_UNITS:g} float32 rounding of its mean magnitude): every "
                    f"element moved alike, not rounding (its largest gap {self.error:.3g}, "
                    f"within {self.limit:.3g})")
        own = (f"the larger float32 error, the reference's {self.reference_error:.2g} "
               f"or the candidate's own {self.candidate_error:.2g} (it rounds in float32 "
               f"where float64 does not reach: {self.island})" if self.island else
               f"the reference's own float32 error {self.reference_error:.2g}")
        return (f"{IN_FLOAT64} on the same inputs, the candidate's output is "
                f"{self.error:.3g} from the reference's (budget {self.limit:.3g}: "
                f"{CONFIRM_FACTOR:g}x {own} + {CONFIRM_UNITS:g} float32 roundings): not "
                "rounding")


def float64_limit(reference_error: float, candidate_error: float, scale: float) -> float:
    """The float64 budget: the larger float32 error, ``CONFIRM_FACTOR`` times, plus
    ``CONFIRM_UNITS`` float32 roundings of ``scale`` (the output's largest magnitude)."""
    return CONFIRM_FACTOR * max(reference_error, candidate_error) \
        + CONFIRM_UNITS * UNIT[torch.float32] * scale


def _over(gap: float, limit: float) -> float:
    """``gap`` in units of ``limit``: infinite where the limit is 0 and the gap is not."""
    if limit > 0:
        return gap / limit
    return math.inf if gap > 0 else 0.0


def checked(candidate: torch.Tensor, reference: torch.Tensor, reference32: torch.Tensor,
            keep: torch.Tensor, island: str = "",
            candidate32: torch.Tensor | None = None,
            scale: float | None = None) -> Float64Check:
    """The check of ``candidate``'s float64 output against ``reference``'s (both of its
    shape), over ``keep``: against the reference's own float32 error (``reference32``, its
    float32 output) and, where the candidate's run holds an ``island``, the candidate's
    own (``candidate32``, its float32 output on the same inputs). ``scale``: the reference
    output's largest magnitude over ``keep``, where known already."""
    own = candidate32.double().reshape(candidate.shape) \
        if island and candidate32 is not None else None
    error = largest_gap(candidate, reference, keep)
    reference_error = largest_gap(reference32.double(), reference, keep)
    candidate_error = largest_gap(own, candidate, keep) if own is not None else 0.0
    mean_error = mean_gap(candidate, reference, keep)
    reference_mean = mean_gap(reference32.double(), reference, keep)
    candidate_mean = mean_gap(own, candidate, keep) if own is not None else 0.0
    return Float64Check(
        error, reference_error,
        float64_limit(reference_error, candidate_error,
                      largest(reference32, keep) if scale is None else scale),
        island, candidate_error, mean_error, reference_mean, candidate_mean,
        MEAN_FACTOR * max(reference_mean, candidate_mean)
        + MEAN_UNITS * UNIT[torch.float32] * mean_magnitude(reference, keep))


class Unproven(Exception):
    """The float64 run cannot prove anything (why, in words)."""


class _InFloat64(TorchDispatchMode):
    """Every op run in float64: floating arguments of less precision taken up, float
    dtypes asked for made float64 (the default dtype is float64 meanwhile: ``_run``).
    A float32 value the run was not given (its inputs, the modules' weights and buffers)
    was rounded where the mode does not reach, as is one an op returns that computes in
    float32 inside: the run's first such is its ``island`` (with ``islands`` False, the
    run proves nothing), and one coarser than float32 proves nothing."""

    def __init__(self, given: Iterable[torch.Tensor], islands: bool = False,
                 watch: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self._given = {_storage(t) for t in given}
        self._islands = islands
        self._watch = watch  # (``departure``: told each value the run computes or takes up)
        self.unproven = ""
        self.island = ""

    def _rounded(self, what: str, dtype: torch.dtype) -> None:
        """A value of ``dtype`` rounded where the mode does not reach (``what``)."""
        if self._islands and dtype == torch.float32:
            self.island = self.island or what
        else:
            self.unproven = self.unproven or what

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            leaves, _ = tree_flatten((args, kwargs))
            if any(_lower(t) for t in leaves):
                self.unproven = self.unproven or f"{func} writes into a float32 value"
            return func(*args, **kwargs)
        args, kwargs = tree_map(self._taken_up, (args, kwargs))
        kwargs = {k: _HIGHER.get(v, v) if k == "dtype" else v for k, v in kwargs.items()}
        returned = func(*args, **kwargs)
        for t in tree_flatten(returned)[0]:
            if _lower(t):
                # every argument and dtype asked for float64, and less came back: the op
                # computes in less inside (a custom op casting to float32, below the mode)
                self._rounded(f"{func} returns {_dtype_name(t)}", t.dtype)
        returned = tree_map(lambda t: t.to(_HIGHER[t.dtype]) if _lower(t) else t, returned)
        if self._watch is not None:
            for t in tree_flatten(returned)[0]:
                self._watch(t)
        return returned

    def _taken_up(self, value: Any) -> Any:
        if not _lower(value):
            return value
        outside = _storage(value) not in self._given
        if outside:
            self._rounded(f"a {_dtype_name(value)} value from outside the run (NumPy, a "
                          "thread, a constant)", value.dtype)
        exact = None if outside else exact_in_float64(_storage(value))
        if exact is not None and exact.shape == value.shape:
            return exact  # (a folded bias: its exact sum, ``folds.exact_values``)
        taken = value.to(_HIGHER[value.dtype])
        if outside and self._watch is not None:
            self._watch(taken)
        return taken


class ReferenceCalls:
    """The reference's module calls by the values they returned: the call that computed
    a pair's reference output, run again in float64."""

    def __init__(self, calls: Iterable[ModuleCall]) -> None:
        self._calls = list(calls)
        self._index: dict[tuple[object, ...], list[tuple[ModuleCall, str]]] | None = None

    @property
    def _returned(self) -> dict[tuple[object, ...], list[tuple[ModuleCall, str]]]:
        """Each call by the values it returned, indexed on first use: most diffs run no
        pair in float64 at all."""
        if self._index is None:
            self._index = {}
            for call in self._calls:
                for leaf in call.outputs:
                    self._index.setdefault(view_key(leaf.value), []).append(
                        (call, leaf.path))
        return self._index

    def computing(self, pair: ModulePair) -> ReferenceRun | None:
        """The reference call that returned ``pair``'s reference output from the values
        ``pair``'s inputs stand for: it took each of them, and every value it took that a
        reference module computed is one of them (the block around a LayerNorm, not the
        LayerNorm alone, which takes the attention's output too); the deepest such. Else
        the deepest that took each of them, where each other value it took that a module
        computed is run again in float64 by that module's call, on what that call took (a
        Llama layer's rotary tables, computed once for all layers from the positions: the
        candidate's layer computes its own in float64, and the reference's must too). None
        where none did. A value the pair stands on may be a view of the call's (the
        reference's laid out as a sequence-first port lays them: ``view_of``)."""
        wanted = pair.output.boundary.value
        found = self._returned.get(view_key(wanted), [])
        viewed = False
        if not found:  # (a view of what a call returned: the same view of its float64 run)
            found, viewed = self._calls_returning_into(wanted), True
        found = sorted(found, key=lambda c: -c[0].name.count(".") if c[0].name else 1)
        candidates = []
        for call, path in found:
            taken = {view_key(leaf.value): leaf for leaf in call.inputs if leaf.unchanged()}
            given = _given_by(pair, taken)
            if given is None:
                continue
            source = next((leaf.value for leaf in call.outputs if leaf.path == path), None) \
                if viewed else None
            view = wanted if isinstance(source, torch.Tensor) else None
            missing = [(leaf.path, self._returned[k][0]) for k, leaf in taken.items()
                       if k in self._returned and k not in given]
            if not missing:
                return ReferenceRun(call, path, (), source if view is not None else None,
                                    view)
            candidates.append(ReferenceRun(call, path, tuple(
                (at, producer, produced) for at, (producer, produced) in missing),
                source if view is not None else None, view))
        return candidates[0] if candidates else None

    def _calls_returning_into(self, view: torch.Tensor) -> list[tuple[ModuleCall, str]]:
        return [(call, leaf.path) for call in self._calls for leaf in call.outputs
                if isinstance(leaf.value, torch.Tensor) and views_into(view, leaf.value)]


def _given_by(pair: ModulePair, taken: Mapping[tuple[object, ...], Any],
              ) -> set[tuple[object, ...]] | None:
    """The keys of ``taken`` (a call's input leaves, by their views) that ``pair``'s
    inputs stand for: each the value itself or a view into it; None where one is
    neither."""
    given = set()
    for match in pair.inputs:
        value = match.boundary.value
        key = view_key(value)
        if key in taken:
            given.add(key)
            continue
        into = [k for k, leaf in taken.items()
                if isinstance(leaf.value, torch.Tensor) and views_into(value, leaf.value)]
        if not into:
            return None
        given.add(into[0])
    return given


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """A reference call to run again in float64, and the values it took that are run
    again first: (where it took it, the call that returned it, where that call did)."""

    call: ModuleCall
    path: str
    again: tuple[tuple[str, ModuleCall, str], ...] = ()
    # where the pair's reference output is a view of what the call returned there
    # (``view_of``): what it returned, and the view
    source: torch.Tensor | None = None
    view: torch.Tensor | None = None


def float64_check(pair: ModulePair, reference: ReferenceRun, keep: torch.Tensor,
                  scale: float) -> Float64Check | None:
    """Both modules of ``pair`` run again in float64 on the reference's inputs (the
    reference's, ``ReferenceCalls.computing``, on its own call's, which are those): the
    check, or None where it proves nothing. ``keep``: the elements compared; ``scale``:
    the reference output's largest magnitude there."""
    call = pair.call
    reference_call, reference_path = reference.call, reference.path
    if call.context and call.context[0] or reference_call.context and reference_call.context[0]:
        return None  # under autocast: its dtypes are the region's, not the values'
    if call.batched is not None:  # (a call under vmap: its run maps it again, ``local``)
        return None
    try:
        ref_args: Any = list(reference_call.args)
        ref_kwargs = dict(reference_call.kwargs)
        for at, producer, produced in reference.again:  # (what it took, in float64 too)
            put(ref_args, ref_kwargs, at, _run(producer, list(producer.args),
                                               dict(producer.kwargs), produced)[0])
        reference_out, _ = _run(reference_call, ref_args, ref_kwargs, reference_path)
        if reference.view is not None and reference.source is not None:
            if not isinstance(reference_out, torch.Tensor) \
                    or reference_out.numel() != reference.source.numel():
                return None
            reference_out = as_viewed(reference_out, reference.source, reference.view)
        args, kwargs = on_reference_inputs(pair)
        candidate, island = _run(call, args, kwargs, pair.output.path, islands=True)
        own = _in_float32(call, args, kwargs, pair.output.path) if island else None
    except Unproven:
        return None
    wanted = pair.output.boundary
    if not all(isinstance(t, torch.Tensor) for t in (reference_out, candidate)) \
            or reference_out.shape != wanted.value.shape \
            or candidate.numel() != reference_out.numel() \
            or island and (not isinstance(own, torch.Tensor) or own.shape != candidate.shape):
        return None
    candidate = candidate.reshape(reference_out.shape)
    return checked(candidate, reference_out, wanted.value, keep, island,
                   own if isinstance(own, torch.Tensor) else None, scale)


def on_reference_inputs(pair: ModulePair) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of ``pair``'s candidate call (copies), the reference's values in
    place of those its inputs stand for."""
    call = pair.call
    args: Any = [copied(a) for a in call.args]
    kwargs = {k: copied(v) for k, v in call.kwargs.items()}
    for match in pair.inputs:
        put(args, kwargs, match.path,
            as_argument(match.boundary.value, value_at(args, kwargs, match.path)))
    return args, kwargs


def _in_float32(call: ModuleCall, args: list[Any], kwargs: dict[str, Any], path: str) -> Any:
    """``call``'s module run as the user runs it, in float32, on ``args``/``kwargs``: what
    it returned at ``path`` (an island's candidate's own float32 output). Raises
    ``Unproven``."""
    try:
        with torch.set_grad_enabled(call.grad):
            out = output_at(keeping_nothing(lambda: call.module(*copied(args),
                                                                **copied(kwargs))), path)
    except Exception as e:  # noqa: BLE001  a run that raises proves nothing
        raise Unproven(type(e).__name__) from e
    return out.detach() if isinstance(out, torch.Tensor) else out


def _run(call: ModuleCall, args: list[Any], kwargs: dict[str, Any], path: str,
         islands: bool = False) -> tuple[Any, str]:
    """``call``'s module run on ``args``/``kwargs`` in float64 (``run_in_float64``): what it
    returned at ``path``, and its island. Raises ``Unproven``."""
    given = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    returned, island = run_in_float64(call.module, given, call.grad,
                                   lambda: call.module(*copied(args), **copied(kwargs)),
                                   islands)
    out = output_at(returned, path)
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out), island


def run_in_float64(module: torch.nn.Module, given: list[torch.Tensor], grad: bool,
                   run: Callable[[], Any], islands: bool = False,
                   watch: Callable[[Any], None] | None = None) -> tuple[Any, str]:
    """``run()`` under ``_InFloat64`` (given ``given``, ``module``'s weights and buffers),
    the default dtype float64, autograd ``grad``: what it returned, and its first island
    (allowed where ``islands``); ``watch``, where given, is told each value the run
    computes or takes up from outside it. Raises ``Unproven``: the run raised, or proves
    nothing."""
    mode = _InFloat64([*given, *module.parameters(), *module.buffers()], islands, watch)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        # compiled code runs as written, dynamo out of the way ("force_eager"): a call it
        # saw with float64 values would stay in its cache (``config.disable`` too marks the
        # code), and the user's own float32 calls then run eagerly, rounding where the
        # compiled graph did not
        with torch.set_grad_enabled(grad), torch.compiler.set_stance("force_eager"), mode:
            returned = keeping_nothing(run)
    except Exception as e:  # noqa: BLE001  a run that raises proves nothing
        raise Unproven(type(e).__name__) from e
    finally:
        torch.set_default_dtype(before)
    if mode.unproven:
        raise Unproven(mode.unproven)
    return returned, mode.island


def _lower(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _HIGHER


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


__all__ = ["CONFIRM_FACTOR", "CONFIRM_SHARE", "CONFIRM_UNITS", "IN_FLOAT64", "MEAN_FACTOR",
           "MEAN_UNITS", "ON_AVERAGE", "Float64Check", "checked",
           "ReferenceCalls", "ReferenceRun", "Unproven", "WholeCheck", "float64_check",
           "float64_limit", "on_reference_inputs", "run_in_float64", "run_model_in_float64",
           "whole_models_in_float64"]


@dataclasses.dataclass(frozen=True)
class WholeCheck:
    """Both whole models run again in float64: the worst output's check, and its names."""

    reference_output: str
    candidate_output: str
    check: Float64Check


def whole_models_in_float64(reference: torch.nn.Module, candidate: torch.nn.Module,
                            ref_inputs: Mapping[str, torch.Tensor],
                            cand_inputs: Mapping[str, torch.Tensor],
                            reference_outputs: Mapping[str, torch.Tensor],
                            candidate_outputs: Mapping[str, torch.Tensor],
                            names: Iterable[tuple[str, str]],
                            real: torch.Tensor | None) -> WholeCheck | None:
    """Each model's own call run again in float64 (``_InFloat64``), under ``no_grad``, on
    its inputs: for each pair of outputs ``names`` pairs (the outputs' verdict's), the
    candidate's against the reference's, against the reference's own float32 error (its
    output in ``reference_outputs``, from its plain call; with the candidate's own, in
    ``candidate_outputs``, where the candidate's run holds an island). The worst; None
    where a run proves nothing. What covers a candidate whose computation no module of
    its own holds (a port written as functions, a layer's feed-forward in a compiled
    method)."""
    try:
        ref64 = flatten_outputs(run_model_in_float64(reference, ref_inputs)[0])
        returned, island = run_model_in_float64(candidate, cand_inputs, islands=True)
        cand64 = flatten_outputs(returned)
    except Unproven:
        return None
    worst: WholeCheck | None = None
    for ref_name, cand_name in names:
        r32, r64, c64, c32 = reference_outputs.get(ref_name), ref64.get(ref_name), \
            cand64.get(cand_name), candidate_outputs.get(cand_name)
        if not (_floating(r32) and _floating(r64) and _floating(c64)) \
                or r32.numel() != c64.numel() or r32.shape != r64.shape:
            continue
        if island and not (_floating(c32) and c32.shape == c64.shape):
            return None  # (an island's own float32 error not known: nothing proven)
        check = checked(c64.reshape(r32.shape), r64, r32, kept(r32, r64, real), island,
                        c32 if _floating(c32) else None)
        if check.limit > 0 and (worst is None or check.badness > worst.check.badness):
            worst = WholeCheck(ref_name, cand_name, check)
    return worst


def _floating(value: Any) -> TypeGuard[torch.Tensor]:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def run_model_in_float64(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                         islands: bool = False, watch: Callable[[Any], None] | None = None,
                         ) -> tuple[Any, str]:
    """``model(**inputs)`` in float64 under ``no_grad`` (``run_in_float64``, ``watch``
    told each value), and its island."""
    given = [t for t in inputs.values() if isinstance(t, torch.Tensor)]
    return run_in_float64(model, given, False, lambda: model(**{
        k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}),
        islands, watch)
