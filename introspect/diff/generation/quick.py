"""One-token steps measured on the values both models computed, with no replay.

Every step after the prefill is recorded on both sides as the diff records (``eager``),
keeping each node's value as the model made it, into a flat log of calls
(``call_log``): its fx graph is built only for a step that is aligned anew or goes to
the full diff. The alignment of a step is reused for the next one under a proof taken
at every step:

- the two logs are those the alignment was made for: the same calls, ops, targets,
  inputs, dtypes and ranks (only the cache's length changes from step to step; the
  same targets in the same order give the same node names, so the alignment's pairs
  hold, by index, for the new step);
- neither model changed: the same parameter and buffer objects, with the same
  ``data_ptr()``, version counter (``tensor._version``), shape, stride and dtype, and
  the same fingerprint otherwise (hooks, attributes, classes, torch's global state:
  ``introspect.models.ports.fingerprint``).

Where the proof fails (a port that edits or swaps a weight between steps, a graph that
changes), the step is aligned anew, weight relations and all.

Each aligned pair is then measured as the replay measures it (``compare.measure``, with
regions and layouts), on the values the models computed. A step passes here when no pair
is over its budget, none holds NaN or Inf, no drift appears and the caches agree: the
full diff could not fail it, since a row fails only where the candidate's own value is
over budget (``divergence.confirm_failures``) and drift reads those same values
(``drift``). Any other step gets the full diff (local errors, hints, tables), made from
the same two recordings: a step never runs twice, so a cache is never updated twice.
No fx node and no tensor metadata is written for a step that passes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from introspect.diff.generation.call_log import CallLog, log_forward
from introspect.diff.ops.align import Alignment, align_graphs
from introspect.diff.ops.compare.layouts import Layout, fit_layouts, narrow
from introspect.diff.ops.drift import drift_limit
from introspect.diff.ops.eager import write_metadata
from introspect.diff.tolerance import Budget, Tolerance
from introspect.models.ports import fingerprint

_FIT_RATIO = 0.01  # as compare's: a layout other than the proven one must fit this much better
_MEASURED_ALONE = 1 << 12  # elements: a value this large is not copied into its group's


def model_state(model: torch.nn.Module) -> tuple[Any, ...]:
    """What must not change for an alignment to serve again: every parameter and buffer
    by identity, storage and version counter, and the fingerprint without the weights'
    bytes (their version counters prove them unchanged without reading them)."""
    tensors = tuple((name, id(t), t.data_ptr(), t._version, tuple(t.shape), t.stride(),
                     t.dtype, t.device)
                    for name, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                                   model.named_buffers(remove_duplicate=False)))
    return tensors, fingerprint(model, tensors=False)


def graph_signature(log: CallLog) -> tuple[Any, ...]:
    """A recorded step's structure: what an alignment made on it depends on, but the
    sizes that grow with the cache (``CallLog.signature``)."""
    return log.signature()


@dataclass
class _Aligned:
    """An alignment, its budgets and what it was made on."""

    alignment: Alignment
    budgets: list[Budget]
    signatures: tuple[Any, Any]
    states: tuple[Any, Any]
    reference_order: dict[str, int]
    candidate_order: dict[str, int]
    pair_dtypes: list[tuple[str, str]]
    model_dtypes: list[str]
    # each pair's calls in the two logs (None: not a call's value), in the order the
    # pairs are measured (the candidate's order)
    measured: list[tuple[int, int | None, int | None]]
    layouts: dict[int, Layout] = field(default_factory=dict)


class QuickSteps:
    """Records one-token steps and says which of them pass without a full diff.

    Example::

        quick = QuickSteps(hf, port, Tolerance())
        recordings = quick.record({"input_ids": token}, hf_keywords, port_keywords)
        if not quick.passes(*recordings):
            ...  # the full diff, from these recordings
    """

    def __init__(self, reference: torch.nn.Module, candidate: torch.nn.Module,
                 tolerance: Tolerance, name_map: Mapping[str, str] | None = None) -> None:
        self.reference, self.candidate = reference, candidate
        self.tolerance = tolerance
        self.name_map = name_map
        self.aligned: _Aligned | None = None
        self.aligned_steps = 0  # steps that were aligned (the others reused an alignment)
        self.quick_steps = 0  # steps that passed here, with no full diff
        # the last step that did not pass here was over a budget (a value over it, NaN or
        # drift), not passed on to the full diff for what this cannot read (a value
        # changed in place, a feature order, a layout)
        self.over_budget = False
        # with noise: the first pair over its budget, in the candidate's order (the
        # reference's node name): the full diff's nodes keep the default budgets
        self.first_over: str | None = None

    def record(self, tensors: Mapping[str, torch.Tensor], ref_keywords: Mapping[str, Any],
               cand_keywords: Mapping[str, Any]) -> tuple[CallLog, CallLog]:
        """Both sides' step, logged with every value kept (the reference first);
        ``CallLog.recording()`` is the step's ``Recording``, built when asked."""
        from introspect.diff.ops.explain import accepted_inputs as _accepted_inputs

        return tuple(log_forward(model, _accepted_inputs(model, tensors), keywords)  # type: ignore[return-value]
                     for model, keywords in ((self.reference, ref_keywords),
                                             (self.candidate, cand_keywords)))

    def states(self) -> tuple[Any, Any]:
        """Both models' state (``model_state``), taken as a step starts."""
        return model_state(self.reference), model_state(self.candidate)

    def passes(self, reference: CallLog, candidate: CallLog,
               tensors: Mapping[str, torch.Tensor], states: tuple[Any, Any],
               noise: Mapping[int, float] | None = None) -> bool:
        """Whether every aligned pair of the step is within budget, finite and drift-free.

        ``states``: both models' ``states()`` as the step started; the alignment of an
        earlier step serves only where they and the graphs are those it was made on.
        ``noise``: with ``noise_budget``, each reference call's rounding noise in the
        candidate's dtype (``loop._TwinNoise``): its pair's atol is at least
        ``noise_factor`` times it.

        Raises:
            InputError: the step's graphs cannot be aligned (as the diff raises it).
        """
        self.over_budget, self.first_over = False, None
        signatures = (graph_signature(reference), graph_signature(candidate))
        aligned = self.aligned
        if aligned is None or aligned.signatures != signatures or aligned.states != states:
            aligned = self.aligned = self._align(reference, candidate, tensors, signatures,
                                                 states)
        return self._within_budget(aligned, reference, candidate, noise or {})

    def _align(self, reference: CallLog, candidate: CallLog,
               tensors: Mapping[str, torch.Tensor], signatures: tuple[Any, Any],
               states: tuple[Any, Any]) -> _Aligned:
        from introspect.diff.ops.explain import _budgets, _pair_dtypes, record_for_diff
        from introspect.diff.ops.explain import model_dtypes as _model_dtypes

        graphs = []
        for model, log, title in ((self.reference, reference, "reference"),
                                  (self.candidate, candidate, "candidate")):
            recording = log.recording()
            write_metadata(recording)
            graphs.append(record_for_diff(model, tensors, title, {}, recording)[0])
        ref_graph, cand_graph = graphs
        alignment = align_graphs(ref_graph, cand_graph, name_map=self.name_map)
        candidate_dtypes = sorted(_model_dtypes(self.candidate))
        budgets = _budgets(alignment, ref_graph, cand_graph, self.tolerance, None,
                           candidate_dtypes)
        self.aligned_steps += 1
        candidate_order = {r.name: r.index for r in cand_graph.records}
        pairs = alignment.pairs
        ref_calls = {name: i for i, name in enumerate(reference.names)}
        cand_calls = {name: i for i, name in enumerate(candidate.names)}
        measured = [(i, ref_calls.get(pairs[i].reference), cand_calls.get(pairs[i].candidate))
                    for i in sorted(range(len(pairs)), key=lambda i: (
                        candidate_order.get(pairs[i].candidate, -1), i))]
        return _Aligned(alignment, budgets, signatures, states,
                        {r.name: r.index for r in ref_graph.records}, candidate_order,
                        _pair_dtypes(alignment, ref_graph, cand_graph),
                        [*_model_dtypes(self.reference), *candidate_dtypes], measured)

    def _within_budget(self, aligned: _Aligned, reference: CallLog,
                       candidate: CallLog, noise: Mapping[int, float]) -> bool:
        """Every pair within its budget, finite, and free of drift, measured as the replay
        measures (``compare.measure``: the values in their promoted dtype, the budget
        ``atol + rtol * |reference|``; ``drift``: the largest error against what rounding
        explains), all pairs of one dtype and budget in one pass. False at the first
        pair the full diff must see (a value changed in place after it was made, a
        feature order or a layout to find)."""
        pairs = aligned.alignment.pairs
        aligned_budgets = list(aligned.budgets)  # (this step's, widened by its noise)
        proven: dict[tuple[Any, ...], tuple[object, ...]] = {}
        groups: dict[tuple[Any, ...], list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
        with torch.no_grad():
            for i, ref_call, cand_call in aligned.measured:
                if ref_call is None or cand_call is None:
                    continue
                pair = pairs[i]
                ref, cand = reference.values[ref_call], candidate.values[cand_call]
                if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
                    continue  # the replay compares tensors only (a split's tuple: its items)
                # a value changed in place after it was made: the replay measures it as
                # it was, so the kept value cannot stand for it
                if reference.changed(ref_call) or candidate.changed(cand_call) \
                        or pair.feature_order is not None:
                    return False
                if pair.reference_region is not None:
                    ref = narrow(ref, pair.reference_region)
                if pair.candidate_region is not None:
                    cand = narrow(cand, pair.candidate_region)
                budget = aligned.budgets[i]
                if ref_call in noise:
                    budget = dataclasses.replace(budget, atol=max(
                        budget.atol, self.tolerance.noise_factor * noise[ref_call]))
                    aligned_budgets[i] = budget
                if cand.shape != ref.shape:
                    cand = self._in_layout(aligned, i, cand, ref, budget, proven)
                    if cand is None:
                        return False
                if ref.numel() == 0:
                    continue
                dtype = torch.promote_types(cand.dtype, ref.dtype)
                if not dtype.is_floating_point:
                    dtype = torch.float64
                groups.setdefault((dtype, budget.atol, budget.rtol), []).append((i, cand, ref))
            largest: dict[int, tuple[float, float]] = {}  # pair -> (max error, max |ref| or 0.0)
            for (dtype, atol, rtol), members in groups.items():
                found = _group_errors(dtype, atol, rtol, members)
                if found is None:
                    self.over_budget = True
                    if noise:
                        self.first_over = self._first_over(aligned, groups)
                    return False
                largest.update(found)
        drifted = {i for i, (error, scale) in largest.items()
                   if _drifts(aligned, i, aligned_budgets[i], error, scale)}
        if drifted:
            self.over_budget = True
            if noise:
                self.first_over = self._first_over(aligned, groups, drifted)
            return False
        self.quick_steps += 1
        return True

    @staticmethod
    def _first_over(aligned: _Aligned, groups: Mapping[tuple[Any, ...], list[Any]],
                    drifted: set[int] | None = None) -> str | None:
        """The reference's node of the first pair, in the candidate's order, over its
        budget (``_group_errors``'s test, pair by pair) or its drift limit."""
        over = set(drifted or ())
        for (dtype, atol, rtol), members in groups.items():
            over.update(member[0] for member in members
                        if _group_errors(dtype, atol, rtol, [member]) is None)
        return next((aligned.alignment.pairs[i].reference for i, _, _ in aligned.measured
                     if i in over), None)

    @staticmethod
    def _in_layout(aligned: _Aligned, i: int, cand: torch.Tensor, ref: torch.Tensor,
                   budget: Budget, proven: dict[tuple[Any, ...], tuple[object, ...]],
                   ) -> torch.Tensor | None:
        """``cand`` in the reference's layout, chosen as the replay chooses it (the
        best fit, unless a layout proven on a pair of the same shapes fits nearly as
        well); the choice is kept for the next steps while it still agrees."""
        key = (tuple(cand.shape), tuple(ref.shape), None)
        layout = aligned.layouts.get(i)
        if layout is None or (layout.cand_shape, layout.ref_shape) != key[:2] \
                or proven.get(key, layout.key) != layout.key:
            fits = fit_layouts(cand, ref)
            if not fits:
                return None
            best_error, layout = fits[0]
            expected = proven.get(key)
            if expected is not None and layout.key != expected:
                fallback = min(((e, lay) for e, lay in fits if lay.key == expected),
                               key=lambda fit: fit[0], default=None)
                if fallback is not None and not best_error <= _FIT_RATIO * fallback[0]:
                    layout = fallback[1]
            aligned.layouts[i] = layout
        value = layout.to_reference(cand)
        proven.setdefault(key, layout.key)
        return value


def _drifts(aligned: _Aligned, i: int, budget: Budget, error: float, scale: float) -> bool:
    """Pair ``i``'s largest error past what rounding explains (``drift_limit``); integers
    are compared exactly (``find_drift`` skips them too), and an error within ``atol`` is
    within what rounding explains at any magnitude (no scale read)."""
    if (budget.atol == 0.0 and budget.rtol == 0.0) or error <= budget.atol:
        return False
    return error > drift_limit([*aligned.model_dtypes, *aligned.pair_dtypes[i]], scale,
                               budget.atol)


def _group_errors(dtype: torch.dtype, atol: float, rtol: float,
                  members: list[tuple[int, torch.Tensor, torch.Tensor]],
                  ) -> dict[int, tuple[float, float]] | None:
    """Each pair's largest error and largest reference magnitude, for pairs of one
    promoted dtype and budget measured together; None where an element is over budget
    or any value is NaN or Inf (``measure``'s test, element for element).

    Read in as few passes as the test allows: a NaN or Inf in either value makes the
    error there NaN or Inf (so does an overflow of the difference, which is over any
    budget), and a pair whose largest error is within ``atol`` has every element within
    ``atol + rtol * |reference|`` and is within what rounding explains at any magnitude
    (``drift_limit`` >= ``atol``): its magnitude is read only where its error is over
    ``atol`` (its scale is then reported as 0.0). A large value is measured alone, not
    copied into the group's concatenation.
    """
    found: dict[int, tuple[float, float]] = {}
    together = [m for m in members if m[2].numel() < _MEASURED_ALONE]
    parts = [([i], cand.to(dtype), ref.to(dtype)) for i, cand, ref in members
             if ref.numel() >= _MEASURED_ALONE]
    if together:
        parts.append(([i for i, _, _ in together],
                      torch.cat([cand.reshape(-1).to(dtype) for _, cand, _ in together]),
                      torch.cat([ref.reshape(-1).to(dtype) for _, _, ref in together])))
    for indices, a, b in parts:
        d = (a - b).abs_()
        if len(indices) == 1:
            lengths = [d.numel()]
            errors = [float(d.max()) if d.numel() else 0.0]
        else:
            lengths = [ref.numel() for _, _, ref in together]
            errors = torch.segment_reduce(d, "max", lengths=torch.tensor(lengths)).tolist()
            # an empty value has no error (its segment's max is -inf)
            errors = [error if length else 0.0 for error, length in zip(errors, lengths,
                                                                          strict=True)]
        if not all(math.isfinite(error) for error in errors):
            return None
        d, b = d.reshape(-1), b.reshape(-1)
        start = 0
        for i, error, length in zip(indices, errors, lengths, strict=True):
            scale = 0.0
            if error > atol:
                magnitude = b[start:start + length].abs()
                if bool((d[start:start + length] > (atol + rtol * magnitude)).any()):
                    return None
                scale = float(magnitude.max())
            found[i] = (error, scale)
            start += length
    return found


__all__ = ["QuickSteps", "graph_signature", "model_state"]
