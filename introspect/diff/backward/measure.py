"""A candidate's gradient brought to the reference's layout and measured against it.

Budgets are the forward's (``tolerance``), with ``atol`` taken relative to the magnitude
of the reference's gradient (``_budget``); ``_errors`` says how far two gradients are
apart, NaN and Inf included; ``_Comparer`` makes one row per aligned pair, from stored
gradients or as the candidate's come (``stream``: each measured inside autograd's hook
and let go).

Where a backward let its values go (``backward.record.Shell``), a layout is fitted on
values made again: the reference's forward run again (``backward.again``), only for the
pairs whose shapes differ.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from introspect.diff.backward.hints import gradient_hints
from introspect.diff.backward.record import GradientConsumer, GradientRecording, Shell
from introspect.diff.backward.results import (
    STATUS_DRIFT,
    STATUS_NOT_COMPARED,
    STATUS_OK,
    GradientDiff,
)
from introspect.diff.ops.compare.layouts import (
    ROWS_ORDER,
    TOKENS_ORDER,
    AxisOrder,
    fit_layout,
    inverse_order,
)
from introspect.diff.records import Pair
from introspect.diff.tolerance import Budget, Tolerance

# A gradient's rounding comes from the terms summed into it, not from the sum: one that
# cancels to nearly zero (a key bias: softmax ignores a shift) is measured against at least
# this share of the largest gradient of its kind.
FLOOR = 1e-2


def _budget(tolerance: Tolerance, dtype: torch.dtype, scale: float, noise: float | None) -> Budget:
    """The forward's budget for ``dtype``, its atol relative to the gradient's magnitude."""
    base = tolerance.node_budget(str(dtype).removeprefix("torch."))
    # A NaN or Inf scale or noise (a non-finite gradient) would make every comparison false
    # or true: the budget stays the dtype's own, and the values themselves fail (_errors).
    atol = base.atol * (scale if scale > 0 and math.isfinite(scale) else 1.0)
    if noise is not None and math.isfinite(noise):
        atol = max(atol, tolerance.noise_factor * noise)
    return Budget(atol, base.rtol)


def magnitude_of(tensor: torch.Tensor) -> float:
    """``tensor.abs().max()`` (0 when empty, NaN where it holds NaN) without a copy the
    size of the tensor: its smallest and largest values."""
    if not tensor.numel():
        return 0.0
    low, high = (float(v) for v in torch.aminmax(tensor))
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


_SLICE = 1 << 22  # values of a gradient measured at once (pad-free gradients)


def _largest_of(values: Iterable[float]) -> float:
    """The largest, NaN where any is (as ``torch.max`` over the whole tensor says)."""
    found = list(values)
    return math.nan if any(math.isnan(v) for v in found) else max(found)


def _errors(cand: torch.Tensor, ref: torch.Tensor, budget: Budget,
            pad: torch.Tensor | None = None, allow_nonfinite: bool = False,
            ref_magnitude: float | None = None) -> tuple[float, float, bool, float | None]:
    """(max abs, max rel, over budget, max abs at padding) of two same-shaped gradients.

    NaN or Inf in either is over budget (an error of inf) unless ``allow_nonfinite``:
    the same Inf on both sides is no agreement, only a shared failure.
    ``ref_magnitude``: ``ref.abs().max()``, where the caller has it (finite exactly when
    every value of ``ref`` is).
    """
    if pad is None and ref.numel() > _SLICE and cand.shape == ref.shape:
        # A slice at a time: a word embedding's gradient is 23M values, and its error, its
        # magnitude and its test are as many again each (the diff's peak of memory)
        flat_cand, flat_ref = cand.reshape(-1), ref.reshape(-1)
        parts = [_errors(flat_cand[i:i + _SLICE], flat_ref[i:i + _SLICE], budget, None,
                         allow_nonfinite) for i in range(0, flat_ref.numel(), _SLICE)]
        return _largest_of(p[0] for p in parts), _largest_of(p[1] for p in parts), \
            any(p[2] for p in parts), None
    same = cand.dtype == ref.dtype and torch.equal(cand, ref)  # the common case
    if same and (allow_nonfinite or (ref_magnitude is not None
                                     and math.isfinite(ref_magnitude))):
        # equal and finite (``torch.equal`` is False wherever NaN is): no arithmetic
        return 0.0, 0.0, False, (0.0 if pad is not None else None)
    dtype = torch.promote_types(cand.dtype, ref.dtype)  # float32 keeps a difference's size
    a, b = cand.to(dtype), ref.to(dtype)
    d = None if same else (a - b).abs()
    # A finite largest difference means both sides are finite (NaN or Inf on either side
    # leaves NaN or Inf in it); only otherwise are the two read again, value by value.
    if d is None or (d.numel() and not math.isfinite(float(d.max()))):
        if not allow_nonfinite and cand.is_floating_point() and ref.is_floating_point() \
                and not (bool(torch.isfinite(cand).all()) and bool(torch.isfinite(ref).all())):
            return math.inf, math.inf, True, (math.inf if pad is not None else None)
        if d is None:
            return 0.0, 0.0, False, (0.0 if pad is not None else None)
        if bool(d.isnan().any()):
            d = d.nan_to_num(nan=math.inf)
    magnitude = b.abs()
    over = d > budget.atol + budget.rtol * magnitude
    pad_err = None
    if pad is not None:
        pad_err = float(d.masked_fill(~pad, 0.0).max()) if d.numel() else 0.0
        d = d.masked_fill(pad, 0.0)
        over = over & ~pad
    if d.numel() == 0:
        return 0.0, 0.0, False, pad_err
    rel = d / magnitude.masked_fill(magnitude == 0, math.inf)
    return float(d.max()), float(rel.max()), bool(over.any()), pad_err


def padded_positions(mask: torch.Tensor | None, shape: Sequence[int]) -> torch.Tensor | None:
    """Padded positions of a (B, S, ...) value where ``mask`` (B, S) says so; None where
    it pads nothing or the value is not laid out so."""
    if mask is None or mask.ndim != 2 or bool(mask.all()) or len(shape) < 2 \
            or tuple(shape[:2]) != tuple(mask.shape):
        return None
    pad = (mask == 0).reshape(*mask.shape, *([1] * (len(shape) - 2)))
    return pad.expand(*shape)


def _narrowed(shape: Sequence[int], region: Any) -> tuple[int, ...]:
    """``shape`` narrowed to ``region`` (a ``Region`` or None)."""
    found = list(shape)
    if region is not None:
        found[region.dim] = region.stop - region.start
    return tuple(found)


class _Forming:
    """A candidate's recording while its backward runs: the values (those it keeps, and
    every value's shell), no gradient kept."""

    def __init__(self, recorder: Any) -> None:
        self.values: Mapping[str, torch.Tensor] = recorder.values
        self.requires_grad: set[str] = recorder.requires_grad
        self.grads: Mapping[str, torch.Tensor] = {}
        self.shells: Mapping[str, Shell] = {}


class _Comparer:
    """Brings a candidate gradient to the reference's layout and measures it."""

    def __init__(self, ref: GradientRecording, cand: GradientRecording | _Forming,
                 alignment: Any,
                 records: Mapping[str, Any], cand_records: Mapping[str, Any],
                 tolerance: Tolerance, noise: Mapping[str, float],
                 attention_mask: torch.Tensor | None, allow_nonfinite: bool = False,
                 again: Callable[[], GradientRecording] | None = None) -> None:
        self.ref, self.cand, self.alignment = ref, cand, alignment
        # Where the reference's backward let its values go: its forward again, with its
        # graph, for the values a layout is fitted on and for the local backwards (once).
        self._again = None if again is None else functools.cache(again)
        # Where the candidate's backward let its graph go: its forward again (None: it
        # computed otherwise), for the local backwards (``again_for_candidate``).
        self._candidate_again: Callable[[], GradientRecording | None] | None = None
        self.values_needed: set[str] = set()  # candidate nodes a layout is fitted on
        self.allow_nonfinite = allow_nonfinite
        self.records, self.cand_records = records, cand_records
        self.tolerance, self.noise = tolerance, noise
        self.mask = attention_mask
        self.layouts: dict[tuple[str, str], Any] = {}
        self.streamed: dict[int, GradientDiff] = {}  # pair index -> row, made as it came
        self._by_candidate: dict[str, list[int]] = {}  # candidate node -> pair indices
        self._magnitudes: dict[str, float] = {}
        self._largest: float | None = None

    def plain(self, pair: Pair) -> bool:
        return pair.reference_region is None and pair.candidate_region is None \
            and pair.feature_order is None

    def reference(self) -> GradientRecording:
        """The reference's recording with its values and autograd graph: the one given,
        or, where its backward let them go, its forward run again (``again``)."""
        return self.ref if self._again is None else self._again()

    def reference_value(self, name: str) -> torch.Tensor:
        return self.reference().values[name]

    def candidate(self) -> GradientRecording | None:
        """The candidate's recording with its values and autograd graph: the one given,
        or its forward run again where its backward let them go (None: that run was not
        the same)."""
        if self._candidate_again is None:
            return self.cand if isinstance(self.cand, GradientRecording) else None
        return self._candidate_again()

    def again_for_candidate(self, again: Callable[[], GradientRecording | None]) -> None:
        """How to run the candidate's forward again (``candidate``), once at most."""
        self._candidate_again = functools.cache(again)

    def _cand_shape(self, name: str) -> torch.Size | None:
        value = self.cand.values.get(name)
        if value is not None:
            return value.shape
        shell = self.cand.shells.get(name)
        return None if shell is None else shell.shape

    def needs_values(self, pair: Pair) -> bool:
        """Whether bringing the pair's candidate gradient to the reference's layout fits a
        layout on both values (their shapes differ once regions and orders are taken)."""
        shell, own = self.ref.shells.get(pair.reference), self._cand_shape(pair.candidate)
        if shell is None or own is None:
            return False
        return _narrowed(own, pair.candidate_region) != \
            _narrowed(shell.shape, pair.reference_region)

    def to_reference(self, pair: Pair, cand_value: torch.Tensor) -> torch.Tensor | None:
        """A candidate tensor of ``pair.candidate``'s shape in the reference's layout."""
        shell = self.ref.shells.get(pair.reference)
        own = self.cand.values.get(pair.candidate)
        if shell is None or self._cand_shape(pair.candidate) is None:
            return None
        if pair.candidate_region is not None:
            r = pair.candidate_region
            cand_value = cand_value.narrow(r.dim, r.start, r.stop - r.start)
            own = None if own is None else own.narrow(r.dim, r.start, r.stop - r.start)
        if pair.feature_order is not None:
            inverse = inverse_order(torch.tensor(pair.feature_order))
            cand_value = cand_value[..., inverse]
            own = None if own is None else own[..., inverse]
        if tuple(cand_value.shape) == _narrowed(shell.shape, pair.reference_region):
            return _in_reference_order(pair, cand_value)
        if own is None:  # never: ``values_needed`` kept it
            return None
        key = (pair.reference, pair.candidate)
        if key not in self.layouts:
            self.layouts[key] = fit_layout(
                own, self._ref_view(pair, self.reference_value(pair.reference)))
        layout = self.layouts[key]
        return None if layout is None else \
            _in_reference_order(pair, layout.to_reference(cand_value))

    def to_candidate(self, pair: Pair, ref_value: torch.Tensor) -> torch.Tensor | None:
        """A reference tensor in ``pair.candidate``'s layout (plain pairs only)."""
        own = self.cand.values.get(pair.candidate)
        if own is None or not self.plain(pair):
            return None
        ref_value = _in_candidate_order(pair, ref_value)
        if own.shape == ref_value.shape:
            return ref_value.to(own.dtype)
        key = (pair.reference, pair.candidate)
        if key not in self.layouts:
            self.layouts[key] = fit_layout(own, self.reference_value(pair.reference))
        layout = self.layouts[key]
        return None if layout is None else layout.to_candidate(ref_value).to(own.dtype)

    @staticmethod
    def _ref_view(pair: Pair, value: torch.Tensor) -> torch.Tensor:
        r = pair.reference_region
        return value if r is None else value.narrow(r.dim, r.start, r.stop - r.start)

    def pad_for(self, shape: Sequence[int]) -> torch.Tensor | None:
        """Padded positions of a (B, S, ...) value, where the mask says so."""
        return padded_positions(self.mask, shape)

    def grad(self, side: GradientRecording | _Forming, name: str) -> torch.Tensor | None:
        """The node's gradient; zeros where none flowed into a float value."""
        g = side.grads.get(name)
        if g is not None:
            return g
        value = side.values.get(name)
        if value is None:
            shell = side.shells.get(name)
            return shell.zeros() if shell is not None and shell.is_floating_point() else None
        if not value.is_floating_point():
            return None
        return torch.zeros_like(value)

    def largest(self) -> float:
        """The largest magnitude of any reference gradient (the floor of each budget)."""
        if self._largest is None:
            self._largest = max((self.magnitude(name) for name in self.ref.grads), default=0.0)
        return self._largest

    def magnitude(self, name: str) -> float:
        """The reference gradient's largest magnitude (NaN or Inf where it holds them)."""
        found = self._magnitudes.get(name)
        if found is None:
            g = self.ref.grads[name]
            found = self._magnitudes[name] = magnitude_of(g)
        return found

    def consume(self, name: str, grad: torch.Tensor) -> None:
        """A candidate node's gradient as autograd makes it: its pairs are measured now and
        the gradient let go (``GradientSink``'s consumer)."""
        for index in self._by_candidate.get(name, ()):
            row = self.row(self.alignment.pairs[index], grad, cut=False)
            if row is not None:
                self.streamed[index] = row

    def stream(self) -> GradientConsumer:
        """The consumer for the candidate's backward: rows made as its gradients come.
        The reference's values a layout needs are made ready first: its forward does not
        run inside the candidate's backward. ``values_needed``: the candidate's values
        the layouts read, which must outlive its backward."""
        self._by_candidate = {}
        for index, pair in enumerate(self.alignment.pairs):
            if pair.reference in self.records:
                self._by_candidate.setdefault(pair.candidate, []).append(index)
        self.values_needed = {pair.candidate for indices in self._by_candidate.values()
                              for pair in (self.alignment.pairs[i] for i in indices)
                              if self.needs_values(pair)}
        if self.values_needed:
            self.reference()
        self.largest()
        return self.consume

    def node_rows(self) -> list[GradientDiff]:
        rows = []
        for index, pair in enumerate(self.alignment.pairs):
            row = self.streamed.get(index)
            if row is None and pair.reference in self.records:
                g_cand = self.grad(self.cand, pair.candidate)
                row = None if g_cand is None else self.row(
                    pair, g_cand, cut=pair.candidate not in self.cand.requires_grad)
            if row is not None:
                rows.append(row)
        return rows

    def row(self, pair: Pair, g_cand: torch.Tensor, cut: bool) -> GradientDiff | None:
        """One aligned pair's gradients measured (None: the reference has no gradient)."""
        record = self.records[pair.reference]
        g_ref = self.grad(self.ref, pair.reference)
        if g_ref is None:
            return None
        whole = pair.reference_region is None and pair.reference in self.ref.grads
        g_ref = self._ref_view(pair, g_ref)
        mapped = self.to_reference(pair, g_cand)
        base = dict(reference_node=pair.reference, candidate_node=pair.candidate,
                    module=record.module, layer=record.layer, op=record.op_type,
                    shape=str(tuple(g_ref.shape)), reference_index=record.index)
        if mapped is None or mapped.shape != g_ref.shape:
            return GradientDiff(**base, max_abs_err=None, max_rel_err=None,
                                reference_max_abs=None, local_max_abs_err=None,
                                pad_max_abs_err=None, atol=None, rtol=None,
                                status=STATUS_NOT_COMPARED,
                                hint="no layout maps the candidate's gradient")
        pad = self.pad_for(g_ref.shape)
        scale = self.magnitude(pair.reference) if whole else magnitude_of(g_ref)
        budget = _budget(self.tolerance, g_ref.dtype if g_ref.dtype != torch.float64
                         else mapped.dtype, max(scale, FLOOR * self.largest()),
                         self.noise.get(pair.reference))
        err, rel, over, pad_err = _errors(mapped, g_ref, budget, pad, self.allow_nonfinite,
                                          ref_magnitude=scale)
        hint = ""
        if over or (pad_err is not None and pad_err > budget.atol):
            hint = "; ".join(gradient_hints(mapped, g_ref, pad, cut=cut))
        status = STATUS_DRIFT if over else STATUS_OK
        return GradientDiff(**base, max_abs_err=err, max_rel_err=rel,
                            reference_max_abs=scale, local_max_abs_err=None,
                            pad_max_abs_err=pad_err, atol=budget.atol,
                            rtol=budget.rtol, status=status, hint=hint)


__all__ = ["FLOOR", "magnitude_of", "padded_positions"]


def _axis_order(pair: Pair) -> AxisOrder | None:
    """The rows or tokens in another order the forward found for ``pair``
    (``Pair.axis_order``), as the replay held them."""
    if pair.axis_order is None:
        return None
    axes, order = pair.axis_order
    return AxisOrder(ROWS_ORDER if axes == (0,) else TOKENS_ORDER, axes, torch.tensor(order))


def _in_reference_order(pair: Pair, value: torch.Tensor) -> torch.Tensor:
    """A candidate value (in the reference's layout) with its rows or tokens put back in
    the reference's order, where the forward found them in another."""
    found = _axis_order(pair)
    return value if found is None or not found.fits(value) else found.to_reference(value)


def _in_candidate_order(pair: Pair, value: torch.Tensor) -> torch.Tensor:
    """A reference value with its rows or tokens in the candidate's order."""
    found = _axis_order(pair)
    return value if found is None or not found.fits(value) else found.to_candidate(value)
