"""Diff a port's dumped activations against the reference's: ``introspect.diff_dump``.

The reference is a ``Capture`` (taken live from a model, or read from a file written by
``introspect capture``); the candidate is a ``Dump`` (any framework's tensors under its
own names). Each dumped tensor is aligned to a reference node (``introspect.dump.match``)
and measured: a dump holds each value as the port computed it from its own previous
values, so the error is the propagated one; there is no local error to measure, and the
first divergence is the first dumped tensor, in the reference's graph order, whose error
is over budget. The result is the same ``DiffResult`` a model diff gives (tables,
reports), without the drawing, which needs two graphs.

Example::

    >>> reference = capture(loaded.model, inputs)
    >>> result = diff_dump(reference, read_dump("port.npz"))
    >>> result.first_divergence.reference_node
    'bert_encoder_layer_2_attention_self_query'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from introspect.diff.compare import Padding, measure
from introspect.diff.records import (
    STATUS_FAIL,
    STATUS_OK,
    STATUS_UNMATCHED,
    Divergence,
    LayerDiff,
    NodeDiff,
)
from introspect.diff.tolerance import Budget, Tolerance, compare_dtype
from introspect.dump.capture import Capture
from introspect.dump.formats import Dump
from introspect.dump.match import BY_VALUE, DumpMatch, match_dump
from introspect.errors import InputError


@dataclass
class DumpAlignment:
    """Where each dumped tensor went; stands where a model diff keeps its ``Alignment``."""

    matches: list[DumpMatch]
    notes: list[str] = field(default_factory=list)

    @property
    def pairs(self) -> list[DumpMatch]:
        return [m for m in self.matches if m.reference]

    @property
    def coverage(self) -> float:
        """The share of dumped tensors paired with a reference node."""
        return len(self.pairs) / len(self.matches) if self.matches else 0.0


def diff_dump(reference: Capture, dump: Dump, *, atol: float | None = None,
              rtol: float | None = None, noise_budget: bool = False, noise_factor: float = 4.0,
              name_map: Mapping[str, str] | None = None, reference_label: str = "",
              candidate_label: str = "", reference_model: torch.nn.Module | None = None
              ) -> object:
    """Compare a port's dumped tensors with the reference's captured values.

    Args:
        reference: the reference's values (``capture(...)`` or ``read_capture(...)``).
        dump: the port's tensors (``read_dump(...)``).
        atol, rtol: override the per-dtype budgets; the default budget of each tensor
            follows the lower precision of the two (a bfloat16 dump gets bfloat16's).
        noise_budget: raise each node's atol to ``noise_factor`` times the reference's own
            float32 noise, which the capture must hold (``capture(..., noise=True)``).
        name_map: optional help: dump name -> reference node name.
        reference_label, candidate_label: names for tables and reports.
        reference_model: the model the capture was taken from, when at hand: the first
            divergence is then explained by re-running its block with each classic
            porting bug (``introspect.diff.hypotheses``) against the dumped value.

    Returns:
        A ``DiffResult`` whose rows are the dumped tensors.

    Raises:
        InputError: a dump made from other inputs than the reference's (the difference is
            shown), a dump no tensor of which has the size of a reference value, or
            ``noise_budget`` with a capture that holds no noise measurements.
    """
    from introspect.diff.result import DiffResult

    tolerance = Tolerance(atol=atol, rtol=rtol, noise_factor=noise_factor)
    notes = check_inputs(reference.inputs, dump)
    if noise_budget and not reference.noise:
        raise InputError("--noise-budget needs the reference's noise; capture it with --noise "
                         "(introspect capture --noise) or diff against the live model")
    padding = Padding(reference.inputs.get("attention_mask"))

    def budget(ref: str, name: str) -> Budget:
        dtype = compare_dtype(str(reference.values[ref].dtype).split(".")[-1], dump.dtypes[name])
        return tolerance.budget(dtype, reference.noise.get(ref) if noise_budget else None)

    def agrees(name: str, ref: str, value: torch.Tensor) -> bool:
        target = reference.values[ref]
        stats, equal = measure(value, target, budget(ref, name), padding.mask_for(target.shape))
        return equal or stats.mismatched == 0

    matches = match_dump(dump.values, reference.values, ordered=dump.ordered, agrees=agrees,
                         name_map=name_map)
    if not any(m.reference for m in matches):
        raise InputError(f"no tensor of the dump {dump.path!r} pairs with a value of the "
                         f"reference (inputs {_shapes(reference.inputs)}): was it made from "
                         "other inputs or another model?")
    rows = [_row(m, reference, dump, budget(m.reference, m.name) if m.reference else None,
                 padding) for m in matches]
    rows.sort(key=lambda r: (r.reference_index < 0, r.reference_index, r.candidate_index))
    notes.append("a dump holds each value as the port computed it from its own earlier values: "
                 "every error is propagated (the local columns repeat it)")
    if not dump.ordered:
        notes.append("the dump carries no order; its tensors were aligned by value alone")
    unpaired = [m for m in matches if not m.reference]
    if unpaired:
        notes.append(f"{len(unpaired)} dumped tensor(s) pair with no reference node; each row "
                     "names the closest node of the same size, if any")
    divergence = _first_divergence(rows)
    if divergence is not None and reference_model is not None:
        match = next(m for m in matches if m.name == divergence.candidate_node)
        divergence = replace(divergence, hints=_hints(reference_model, reference, dump, match,
                                                      divergence, tolerance))
    layer_rows = _layers(rows, reference)
    passed = divergence is None
    return DiffResult(passed, divergence, rows, layer_rows,
                      DumpAlignment(matches, notes),
                      reference.graph, None, tolerance, notes,
                      reference_label or reference.model or "reference",
                      candidate_label or dump.path, noise_budget)


def check_inputs(inputs: Mapping[str, torch.Tensor], dump: Dump) -> list[str]:
    """Refuse a dump made from other inputs; return notes on what could not be checked.

    Every integer tensor in the dump is taken for an input the port was fed: it must
    equal one of the reference's inputs (leading dims of size 1 aside).

    Raises:
        InputError: an integer tensor that equals none of the reference's inputs, with
            the first difference shown.
    """
    if not dump.integers:
        return ["the dump carries no token ids, so the inputs it was made from were not "
                "checked; save them with the activations"]
    for name, value in dump.integers.items():
        if any(_same(value, expected) for expected in inputs.values()):
            continue
        expected_name, expected = _closest_input(value, inputs)
        if expected is None:
            raise InputError(f"the dump's {name!r} {tuple(value.shape)} was made from other "
                             f"inputs than the reference's {_shapes(inputs)}")
        where = (value.reshape(expected.shape) != expected).nonzero()[0].tolist()
        raise InputError(
            f"the dump's {name!r} differs from the reference's {expected_name}: at "
            f"{tuple(where)} the dump has {int(value.reshape(expected.shape)[tuple(where)])}, "
            f"the reference {int(expected[tuple(where)])}; diff a dump made from the same "
            "inputs (the capture holds them)")
    return []


def _same(value: torch.Tensor, expected: torch.Tensor) -> bool:
    return (value.numel() == expected.numel() and not expected.is_floating_point()
            and torch.equal(value.reshape(expected.shape).to(expected.dtype), expected))


def _closest_input(value: torch.Tensor, inputs: Mapping[str, torch.Tensor]
                   ) -> tuple[str, torch.Tensor | None]:
    same_size = {k: v for k, v in inputs.items() if v.numel() == value.numel()}
    if not same_size:
        return "", None
    # A 0/1 tensor is most likely a mask; anything else the token ids.
    binary = bool(((value == 0) | (value == 1)).all())
    for name in (("attention_mask",) if binary else ("input_ids", "token_type_ids")):
        if name in same_size:
            return name, same_size[name]
    name = next(iter(same_size))
    return name, same_size[name]


def _shapes(inputs: Mapping[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())


def _row(match: DumpMatch, reference: Capture, dump: Dump, budget: Budget | None,
         padding: Padding) -> NodeDiff:
    value = dump.values[match.name]
    if not match.reference or match.layout is None or budget is None:
        note = (f"pairs with no reference node; closest: {match.closest} (max abs error "
                f"{match.closest_max_abs_err:.3g})" if match.closest else
                f"no reference node holds {value.numel()} values")
        return NodeDiff("", match.name, "", "", "", str(tuple(value.shape)),
                        dump.dtypes[match.name], None, None, None, None, None, None, None, None,
                        None, None, None, None, STATUS_UNMATCHED, "", note, -1, match.position)
    entry = reference.entry(match.reference)
    target = reference.values[match.reference]
    stats, _ = measure(match.layout.apply(value), target, budget,
                       padding.mask_for(target.shape))
    status = STATUS_OK if stats.mismatched == 0 and stats.nonfinite == 0 else STATUS_FAIL
    dtype = entry.dtype if entry.dtype == dump.dtypes[match.name] else \
        f"{entry.dtype}/{dump.dtypes[match.name]}"
    note = str(match.layout) if match.matched_by == BY_VALUE else \
        f"paired by {match.matched_by}; {match.layout}"
    return NodeDiff(match.reference, match.name, entry.module, entry.layer, entry.op,
                    str(tuple(target.shape)), dtype, stats.max_abs, stats.mean_abs,
                    stats.max_rel, stats.mismatched, stats.nonfinite,
                    # no local error without the port's code: the local columns repeat these
                    stats.max_abs, stats.mean_abs, stats.max_rel, stats.mismatched,
                    stats.pad_max_abs, budget.atol, budget.rtol, status, match.matched_by,
                    note, entry.index, match.position)


def _first_divergence(rows: list[NodeDiff]) -> Divergence | None:
    for r in rows:
        if r.status == STATUS_FAIL:
            return Divergence(r.reference_node, r.candidate_node, r.module, r.layer, r.op,
                              r.max_abs_err or 0.0, f"atol {r.atol:.3g} + rtol {r.rtol:.3g} "
                              "* |ref|", ())
    return None


def _hints(model: torch.nn.Module, reference: Capture, dump: Dump, match: DumpMatch,
           divergence: Divergence, tolerance: Tolerance) -> tuple[str, ...]:
    """Hypothesis-tested hints for the first dumped tensor over budget."""
    from introspect.diff.hypotheses import explain_divergence
    from introspect.diff.hypotheses.context import DivergenceContext

    assert match.layout is not None  # a divergence is a paired tensor
    target = reference.values[match.reference]
    value = match.layout.apply(dump.values[match.name]).to(target.dtype)
    budget = tolerance.budget(str(target.dtype).split(".")[-1])
    try:
        return explain_divergence(DivergenceContext(
            model, None, reference.inputs, divergence.reference_node, match.name,
            divergence.module, divergence.layer, target, value, budget.atol, budget.rtol))
    except Exception as e:  # a hint must never break the verdict it explains
        return (f"(hypothesis tests failed: {type(e).__name__}: {e})",)


def _layers(rows: list[NodeDiff], reference: Capture) -> list[LayerDiff]:
    """One row per reference layer that some dumped tensor pairs with."""
    order = list(dict.fromkeys(e.layer for e in reference.entries))
    layers = []
    for layer in order:
        members = [r for r in rows if r.layer == layer and r.reference_node]
        if not members:
            continue
        last = members[-1]
        worst = max(members, key=lambda r: (r.max_abs_err or 0.0) / ((r.atol or 0.0) + 1e-30))
        failing = sum(r.status == STATUS_FAIL for r in members)
        layers.append(LayerDiff(layer, last.reference_node, last.max_abs_err or 0.0,
                                max(r.max_abs_err or 0.0 for r in members),
                                worst.reference_node if failing else "", len(members), failing,
                                0, failing == 0))
    return layers
