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

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.stats import measure
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

# A float16 or bfloat16 dump's error grows with depth as the rounding of each op adds up:
# its budget is this many units of rounding of the node's largest magnitude, times
# sqrt(1 + depth) (depth: the node's layer, the embeddings 0). Measured on a correct
# float16 NumPy BERT (MiniLM, 6 layers): at most 4.9 units (2.4e-3 of the scale), at
# depth 5; the budget there is 8 * sqrt(7) = 21 units.
LOW_PRECISION_UNITS = 8.0
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# Integer or boolean arrays named like these are the inputs the port was fed.
INPUT_NAMES = frozenset({"input_ids", "ids", "token_ids", "tokens", "token_type_ids",
                         "type_ids", "segment_ids", "segments", "attention_mask", "mask",
                         "input_mask", "position_ids"})


@dataclass
class DumpAlignment:
    """Where each dumped tensor went; stands where a model diff keeps its ``Alignment``."""

    matches: list[DumpMatch]
    notes: list[str] = field(default_factory=list)
    reference_nodes: int = 0  # how many values the reference holds

    @property
    def pairs(self) -> list[DumpMatch]:
        return [m for m in self.matches if m.reference]

    @property
    def reference_paired(self) -> int:
        """How many of the reference's nodes some dumped tensor pairs with."""
        return len({m.reference for m in self.pairs})

    @property
    def coverage(self) -> float:
        """The share of the reference's nodes paired with a dumped tensor."""
        return self.reference_paired / self.reference_nodes if self.reference_nodes else 0.0

    @property
    def dump_coverage(self) -> float:
        """The share of dumped tensors paired with a reference node."""
        return len(self.pairs) / len(self.matches) if self.matches else 0.0

    @property
    def coverage_text(self) -> str:
        """Both ways: "N of the reference's M nodes paired; K of the dump's L tensors paired"."""
        return (f"{self.reference_paired} of the reference's {self.reference_nodes} nodes "
                f"paired; {len(self.pairs)} of the dump's {len(self.matches)} tensors paired")


def diff_dump(reference: Capture, dump: Dump, *, atol: float | None = None,
              rtol: float | None = None, noise_budget: bool = False, noise_factor: float = 4.0,
              name_map: Mapping[str, str] | None = None, reference_label: str = "",
              candidate_label: str = "", reference_model: torch.nn.Module | None = None,
              allow_nonfinite: bool = False) -> object:
    """Compare a port's dumped tensors with the reference's captured values.

    Args:
        reference: the reference's values (``capture(...)`` or ``read_capture(...)``).
        dump: the port's tensors (``read_dump(...)``).
        atol, rtol: override the per-dtype budgets; the default budget of each tensor
            follows the lower precision of the two (a bfloat16 dump gets bfloat16's), and
            for a float16 or bfloat16 dump grows with depth, as rounding adds up
            (``LOW_PRECISION_UNITS``; not when ``atol`` is given).
        noise_budget: raise each node's atol to ``noise_factor`` times the reference's own
            float32 noise, which the capture must hold (``capture(..., noise=True)``).
        name_map: optional help: dump name -> reference node name.
        reference_label, candidate_label: names for tables and reports.
        reference_model: the model the capture was taken from, when at hand: the first
            divergence is then explained by re-running its block with each classic
            porting bug (``introspect.diff.hypotheses``) against the dumped value.
        allow_nonfinite: NaN or Inf in a dumped tensor (paired or not) or in a compared
            reference value is a note, not a failure.

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

    depth = _depths(reference)
    scales: dict[str, float] = {}

    def scale(ref: str) -> float:
        if ref not in scales:
            value = reference.values[ref]
            scales[ref] = float(torch.nan_to_num(value.detach().double(), nan=0.0, posinf=0.0,
                                                 neginf=0.0).abs().max()) if value.numel() \
                else 0.0
        return scales[ref]

    # A mixed-precision run casts some values back to float32 (ONNX Runtime's float16
    # conversion keeps float32 casts of float16 results): such a tensor carries the low
    # precision's error, so in a dump holding float16/bfloat16 every tensor gets the budget of
    # its lowest precision.
    low = sorted({d for d in dump.dtypes.values() if d in UNIT_ROUNDOFF},
                 key=lambda d: -UNIT_ROUNDOFF[d])

    def budget(ref: str, name: str) -> Budget:
        dtype = compare_dtype(str(reference.values[ref].dtype).split(".")[-1],
                              low[0] if low else dump.dtypes[name])
        found = tolerance.budget(dtype, reference.noise.get(ref) if noise_budget else None)
        if dtype in UNIT_ROUNDOFF and atol is None:
            grown = LOW_PRECISION_UNITS * UNIT_ROUNDOFF[dtype] * scale(ref) \
                * math.sqrt(1 + depth.get(ref, 0))
            found = Budget(max(found.atol, grown), found.rtol)
        return found

    def allowance(name: str, ref: str) -> float:
        found = budget(ref, name)
        return found.atol + found.rtol * scale(ref)

    def agrees(name: str, ref: str, value: torch.Tensor) -> bool:
        target = reference.values[ref]
        stats, equal = measure(value, target, budget(ref, name), padding.mask_for(target.shape))
        return equal or (stats.mismatched == 0 and stats.nonfinite == 0)

    matching = match_dump(dump.values, reference.values, ordered=dump.ordered, agrees=agrees,
                          allowance=allowance, layers={e.name: e.layer for e in reference.entries},
                          name_map=name_map)
    matches = matching.matches
    if not any(m.reference for m in matches):
        raise InputError(f"no tensor of the dump {dump.path!r} pairs with a value of the "
                         f"reference (inputs {_shapes(reference.inputs)}): was it made from "
                         "other inputs or another model?")
    rows = [_row(m, reference, dump, budget(m.reference, m.name) if m.reference else None,
                 padding, allow_nonfinite) for m in matches]
    rows.sort(key=lambda r: (r.reference_index < 0, r.reference_index, r.candidate_index))
    notes.append("a dump holds each value as the port computed it from its own earlier values: "
                 "every error is propagated (the local columns repeat it)")
    if any(d in UNIT_ROUNDOFF for d in dump.dtypes.values()) and atol is None:
        notes.append(f"a float16/bfloat16 dump's budget grows with depth: {LOW_PRECISION_UNITS:g}"
                     " units of rounding of each node's largest magnitude, times sqrt(1 + its "
                     "layer's depth) (--atol sets one budget instead)")
    if not dump.ordered:
        notes.append("the dump carries no order; its tensors were aligned by value alone")
    notes += matching.notes
    unpaired = [m for m in matches if not m.reference]
    if unpaired:
        notes.append(f"{len(unpaired)} dumped tensor(s) pair with no reference node (each row "
                     "says why); a tensor without partner never fails the diff by itself")
    notes += _nonfinite_notes(rows, allow_nonfinite)
    divergence = _first_divergence(rows)
    broken = [e for e in reference.entries if _nonfinite(reference.values[e.name])]
    if broken:  # a reference that holds NaN or Inf proves nothing, paired or not
        notes.append(f"the reference holds NaN or Inf in {len(broken)} value(s), first at "
                     f"{broken[0].name} ({broken[0].op} in {broken[0].module or broken[0].layer})"
                     f": {'allowed by --allow-nonfinite' if allow_nonfinite else 'the diff fails'}")
        if divergence is None and not allow_nonfinite:
            e = broken[0]
            divergence = Divergence(e.name, "", e.module, e.layer, e.op, math.inf,
                                    "no NaN or Inf in the reference", ())
    if divergence is not None and reference_model is not None and divergence.reference_node:
        match = next(m for m in matches if m.name == divergence.candidate_node)
        divergence = replace(divergence, hints=_hints(reference_model, reference, dump, match,
                                                      divergence, tolerance))
    layer_rows = _layers(rows, reference)
    passed = divergence is None
    return DiffResult(passed, divergence, rows, layer_rows,
                      DumpAlignment(matches, notes, len(reference.values)),
                      reference.graph, None, tolerance, notes,
                      reference_label or reference.model or "reference",
                      candidate_label or dump.path, noise_budget)


def check_inputs(inputs: Mapping[str, torch.Tensor], dump: Dump) -> list[str]:
    """Refuse a dump made from other inputs; return notes on what could not be checked.

    An integer or boolean array of the dump is taken for an input the port was fed when
    it looks like one: named like one (``input_ids``, ``mask``, ``segment_ids``, ...) or of
    an input's shape (leading dims of size 1 aside); it must then equal one of the
    reference's inputs. Other integer and boolean arrays (shapes, lengths, a mask index)
    are not compared, and a note lists them.

    Raises:
        InputError: an input-like array that equals none of the reference's inputs, with
            the first difference shown.
    """
    notes = []
    checked, skipped = 0, []
    for name, value in dump.integers.items():
        if not _looks_like_input(name, value, inputs):
            skipped.append(f"{name!r} {tuple(value.shape)}")
            continue
        checked += 1
        if any(_same(value, expected) for expected in inputs.values()):
            continue
        expected_name, expected = _closest_input(value, inputs)
        if expected is None:
            raise InputError(f"the dump's {name!r} {tuple(value.shape)} was made from other "
                             f"inputs than the reference's {_shapes(inputs)}")
        mine = value.reshape(expected.shape).to(expected.dtype)
        where = (mine != expected).nonzero()[0].tolist()
        raise InputError(
            f"the dump's {name!r} differs from the reference's {expected_name}: at "
            f"{tuple(where)} the dump has {int(mine[tuple(where)])}, "
            f"the reference {int(expected[tuple(where)])}; diff a dump made from the same "
            "inputs")
    if not checked:
        notes.append("the dump carries no token ids, so the inputs it was made from were not "
                     "checked; save them with the activations")
    if skipped:
        shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more"
                                          if len(skipped) > 5 else "")
        notes.append(f"{len(skipped)} integer or boolean array(s) of the dump are neither "
                     f"named nor shaped like an input, and not compared: {shown}")
    return notes


def _looks_like_input(name: str, value: torch.Tensor, inputs: Mapping[str, torch.Tensor]
                      ) -> bool:
    last = re.split(r"[/.:\\]", name.lower())[-1]
    if last in INPUT_NAMES or name in inputs:
        return True
    if value.dim() == 0:
        return False
    return any(_squeezed(tuple(value.shape)) == _squeezed(tuple(v.shape))
               for v in inputs.values())


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


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
         padding: Padding, allow_nonfinite: bool) -> NodeDiff:
    value = dump.values[match.name]
    if not match.reference or match.layout is None or budget is None:
        nonfinite = _nonfinite(value)
        parts = [match.reason] if match.reason else []
        parts.append(f"pairs with no reference node; closest of its size: {match.closest} "
                     f"(max abs error {match.closest_max_abs_err:.3g})" if match.closest else
                     f"no reference node holds {value.numel()} values")
        status = STATUS_UNMATCHED
        if nonfinite:
            parts.append(f"holds {nonfinite} NaN/Inf")
            status = STATUS_UNMATCHED if allow_nonfinite else STATUS_FAIL
        return NodeDiff("", match.name, "", "", "", str(tuple(value.shape)),
                        dump.dtypes[match.name], None, None, None, None, nonfinite or None,
                        None, None, None, None, None, None, None, status, "",
                        "; ".join(parts), -1, match.position)
    entry = reference.entry(match.reference)
    target = reference.values[match.reference]
    stats, _ = measure(match.layout.apply(value), target, budget,
                       padding.mask_for(target.shape))
    nonfinite = max(stats.nonfinite, stats.reference_nonfinite)
    status = STATUS_FAIL if stats.mismatched or (nonfinite and not allow_nonfinite) \
        else STATUS_OK
    dtype = entry.dtype if entry.dtype == dump.dtypes[match.name] else \
        f"{entry.dtype}/{dump.dtypes[match.name]}"
    parts = [str(match.layout) if match.matched_by == BY_VALUE else
             f"paired by {match.matched_by}; {match.layout}"]
    if match.reason:
        parts.append(match.reason)
    if stats.nonfinite:
        parts.append(f"the dump's value holds {stats.nonfinite} NaN/Inf")
    if stats.reference_nonfinite:
        parts.append(f"the reference's value holds {stats.reference_nonfinite} NaN/Inf")
    return NodeDiff(match.reference, match.name, entry.module, entry.layer, entry.op,
                    str(tuple(target.shape)), dtype, stats.max_abs, stats.mean_abs,
                    stats.max_rel, stats.mismatched, nonfinite,
                    # no local error without the port's code: the local columns repeat these
                    stats.max_abs, stats.mean_abs, stats.max_rel, stats.mismatched,
                    stats.pad_max_abs, budget.atol, budget.rtol, status, match.matched_by,
                    "; ".join(parts), entry.index, match.position)


def _nonfinite(value: torch.Tensor) -> int:
    if not value.is_floating_point() or not value.numel():
        return 0
    return int((~torch.isfinite(value)).sum())


def _nonfinite_notes(rows: list[NodeDiff], allowed: bool) -> list[str]:
    holding = [r for r in rows if r.nonfinite]
    if not holding:
        return []
    first = holding[0]
    where = f"{first.candidate_node!r}" + (f" (paired with {first.reference_node})"
                                           if first.reference_node else " (unpaired)")
    verdict = "allowed by --allow-nonfinite" if allowed else "the diff fails"
    return [f"NaN or Inf in {len(holding)} dumped or compared tensor(s), first at {where}: "
            f"{verdict}"]


def _depths(reference: Capture) -> dict[str, int]:
    """Each node's depth: its layer's place in the reference's order (embeddings 0)."""
    layers = list(dict.fromkeys(e.layer for e in reference.entries))
    return {e.name: layers.index(e.layer) for e in reference.entries}


def _first_divergence(rows: list[NodeDiff]) -> Divergence | None:
    for r in rows:
        if r.status == STATUS_FAIL:
            budget = f"atol {r.atol:.3g} + rtol {r.rtol:.3g} * |ref|" if r.atol is not None \
                else "no NaN or Inf"
            return Divergence(r.reference_node, r.candidate_node, r.module, r.layer, r.op,
                              r.max_abs_err or 0.0, budget, ())
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
