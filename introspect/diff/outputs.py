"""The verdict of the truth runs: every output of both models, compared within budget.

``introspect.run.truth`` calls each model plainly; this module pairs their outputs and
measures each pair, for the call with autograd on and for the ``no_grad`` one. A pair
agrees when its largest error is what rounding explains for values of its size
(``atol + TRUTH_RTOL[dtype] * max|ref|``, below) or when every element is within the node budget
(``atol + rtol * |ref|``). Integers and booleans must be equal. PASS needs every pair to
agree in both calls, the candidate's calls to agree with each other bit for bit, and the
inputs to come back unchanged.

Outputs are paired by name first (``logits`` with ``logits``), then, among the leftovers,
each reference output takes the candidate output of its shape whose values are closest
(a port returns a tuple where HF returns a ``ModelOutput``; QA's start and end logits
share a shape).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from introspect.diff.records import (
    CALL_AUTOGRAD,
    CALL_INFERENCE,
    CALL_NO_GRAD,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_UNMATCHED,
    OutputDiff,
)
from introspect.diff.tolerance import DEFAULTS, Tolerance, compare_dtype
from introspect.errors import InputError
from introspect.run.truth import Truth

# Largest error, relative to the output's largest magnitude, that rounding explains at a
# model's outputs. float32: 10x the worst a correct implementation measured anywhere in a
# graph (1.9e-6, ``introspect.diff.ops.drift``), and 5x under the smallest porting fault at an
# output the corpus holds (the tanh GELU in one layer of bert-tiny: 3.6e-5 relative); the
# low precisions keep the drift model's limits (calibrated on casts of MiniLM and Llama).
TRUTH_RTOL = {"float64": 1e-9, "float32": 2e-5, "float16": 2e-2, "bfloat16": 1e-1}


class NoOutputPairs(InputError):
    """No output of the candidate can stand for any of the reference's: nothing to judge."""


@dataclasses.dataclass
class TruthVerdict:
    """What the truth runs decided: the output rows, the notes, and whether parity holds."""

    rows: list[OutputDiff]
    notes: list[str]
    passed: bool
    # Why it fails, in a few words each (for the headline): "outputs", "grad mode", ...
    reasons: list[str]

    def agreeing(self) -> set[str]:
        """The reference's outputs within budget in every call (none when parity fails)."""
        if not self.passed:
            return set()
        return {r.reference_output for r in self.rows if r.status == STATUS_OK} - \
            {r.reference_output for r in self.rows if r.status != STATUS_OK}

    def worst_failing(self) -> OutputDiff | None:
        failing = [r for r in self.rows if r.status == STATUS_FAIL]
        return max(failing, key=lambda r: _ratio(r)) if failing else None


def compare_truths(reference: Truth, candidate: Truth, tolerance: Tolerance,
                   model_dtypes: Sequence[str] = (), allow_nonfinite: bool = False,
                   labels: tuple[str, str] = ("reference", "candidate"),
                   attention_mask: torch.Tensor | None = None) -> TruthVerdict:
    """Compare the candidate's truth runs with the reference's.

    ``attention_mask``: an output laid out (batch, sequence, ...) is compared at real
    tokens only; what a model leaves at padded positions is its own (PyTorch's nested
    tensors write zeros there, HF computes values nobody reads), as the node-level
    comparison keeps padding apart.

    Raises:
        InputError: no output of the candidate can stand for any output of the reference
            (nothing would be compared: no verdict).
    """
    pairs = pair_outputs(reference.grad_outputs, candidate.grad_outputs)
    if not any(c for _, c in pairs):
        raise NoOutputPairs(
            f"the {labels[1]} returns no output the {labels[0]}'s can be compared with: "
            f"{labels[0]} {_shapes(reference.grad_outputs)}, "
            f"{labels[1]} {_shapes(candidate.grad_outputs)}")
    rows: list[OutputDiff] = []
    calls = [(CALL_AUTOGRAD, reference.grad_outputs, candidate.grad_outputs),
             (CALL_NO_GRAD, reference.no_grad_outputs, candidate.no_grad_outputs)]
    if candidate.inference_outputs is not None:  # against the reference's own, or its no_grad
        calls.append((CALL_INFERENCE, reference.inference_outputs or reference.no_grad_outputs,
                      candidate.inference_outputs))
    for call, ref_outputs, cand_outputs in calls:
        for ref_name, cand_name in pairs:
            rows.append(_compare(call, ref_name, ref_outputs.get(ref_name), cand_name,
                                 cand_outputs.get(cand_name) if cand_name else None,
                                 tolerance, model_dtypes, allow_nonfinite, attention_mask))
    notes, reasons = _notes(rows, reference, candidate, labels, allow_nonfinite)
    failing = any(r.status == STATUS_FAIL for r in rows)
    if failing and "outputs" not in reasons and "grad mode" not in reasons:
        reasons.insert(0, "outputs")
    passed = not failing and not reasons
    return TruthVerdict(rows, notes, passed, reasons)


def pair_outputs(reference: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor],
                 ) -> list[tuple[str, str]]:
    """Each reference output and the candidate output that stands for it ("" for none)."""
    used: set[str] = set()
    chosen: dict[str, str] = {}
    for name, value in reference.items():  # same name, same shape
        other = candidate.get(name)
        if other is not None and other.shape == value.shape:
            chosen[name] = name
            used.add(name)
    for name, value in reference.items():  # the closest of the same shape
        if name in chosen:
            continue
        options = [c for c, v in candidate.items() if c not in used and v.shape == value.shape]
        if not options:
            options = [c for c, v in candidate.items() if c not in used
                       and v.squeeze().shape == value.squeeze().shape]
        if options:
            best = min(options, key=lambda c: _distance(value, candidate[c]))
            chosen[name] = best
            used.add(best)
    return [(name, chosen.get(name, "")) for name in reference]


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.dtype.is_floating_point != b.dtype.is_floating_point:
        return math.inf
    diff = (a.double().reshape(-1) - b.double().reshape(-1)).abs().nan_to_num(math.inf)
    return float(diff.max()) if diff.numel() else 0.0


def _compare(call: str, ref_name: str, ref: torch.Tensor | None, cand_name: str,
             cand: torch.Tensor | None, tolerance: Tolerance, model_dtypes: Sequence[str],
             allow_nonfinite: bool, attention_mask: torch.Tensor | None = None) -> OutputDiff:
    if ref is None or cand is None:
        shape = str(tuple(ref.shape)) if ref is not None else ""
        dtype = str(ref.dtype).removeprefix("torch.") if ref is not None else ""
        note = ("the candidate returns no output like it" if cand_name == "" else
                f"missing from the {call} call's outputs")
        status = STATUS_UNMATCHED if cand_name == "" else STATUS_FAIL
        return OutputDiff(ref_name, cand_name, call, shape, dtype, None, None, None, status,
                          note)
    ref_dtype, cand_dtype = (str(t.dtype).removeprefix("torch.") for t in (ref, cand))
    dtype = compare_dtype(ref_dtype, cand_dtype)
    low = dtype
    for weights in model_dtypes:
        low = compare_dtype(low, weights) if low in DEFAULTS else low
    shown_dtype = ref_dtype if ref_dtype == cand_dtype else f"{ref_dtype}/{cand_dtype}"
    shape = str(tuple(ref.shape))
    budget = tolerance.budget(low)
    cand = cand.reshape(ref.shape)
    if attention_mask is not None and ref.dim() >= 2 \
            and tuple(ref.shape[:2]) == tuple(attention_mask.shape):
        real = attention_mask.cpu() != 0  # (B, S): real tokens only
        ref, cand = ref[real], cand[real]
    r = ref.reshape(-1)
    c = cand.reshape(-1)
    floating = r.is_floating_point() or c.is_floating_point()
    r64, c64 = (r.double(), c.double()) if floating else (r.long(), c.long())
    nonfinite = None
    if floating:
        bad = max(int((~torch.isfinite(r64)).sum()), int((~torch.isfinite(c64)).sum()))
        nonfinite = bad or None
    if not floating:
        err = float((r64 - c64).abs().max()) if r64.numel() else 0.0
        status = STATUS_OK if err == 0 else STATUS_FAIL
        return OutputDiff(ref_name, cand_name, call, shape, shown_dtype, err, 0.0, None, status)
    finite = torch.isfinite(r64) & torch.isfinite(c64)
    same_nonfinite = bool(torch.equal(r64[~finite].nan_to_num(), c64[~finite].nan_to_num())
                          and torch.equal(r64.isnan(), c64.isnan()))
    diff = (r64 - c64).abs()[finite]
    err = float(diff.max()) if diff.numel() else 0.0
    scale = float(r64[finite].abs().max()) if diff.numel() else 0.0
    limit = budget.atol + TRUTH_RTOL.get(low, 0.0) * scale
    within = err <= limit or bool((diff <= budget.atol + budget.rtol * r64[finite].abs()).all())
    note = ""
    if nonfinite:
        if not allow_nonfinite:
            within = False
            note = f"NaN or Inf in {nonfinite} value(s)"
        elif not same_nonfinite:
            within = False
            note = "NaN or Inf at other positions than the reference's"
        else:
            note = "NaN or Inf where the reference has them (allowed)"
    status = STATUS_OK if within else STATUS_FAIL
    return OutputDiff(ref_name, cand_name, call, shape, shown_dtype, err, limit, nonfinite,
                      status, note)


def _notes(rows: Sequence[OutputDiff], reference: Truth, candidate: Truth,
           labels: tuple[str, str], allow_nonfinite: bool) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    reasons: list[str] = []
    ref_label, cand_label = labels
    missing = [r.reference_output for r in rows
               if r.call == CALL_AUTOGRAD and r.status == STATUS_UNMATCHED]
    if missing:
        notes.append(f"the {cand_label} returns nothing like the {ref_label}'s "
                     f"{', '.join(missing)}: not compared")
    changed = candidate.changed_between_calls()
    if changed:
        notes.append(f"the {cand_label}'s forward changes from call to call: called twice on "
                     f"the same inputs, it returned other values for {', '.join(changed)}; "
                     "the diff fails, since no single call can be trusted")
        reasons.append("changes from call to call")
    if candidate.inference_raised:
        # (inference mode is per thread: a worker thread runs autograd on its tensors)
        why = "; a worker thread does not inherit inference mode" \
            if "Inference tensors" in candidate.inference_raised else ""
        notes.append(f"the {cand_label} raised under torch.inference_mode() "
                     f"({_cut(candidate.inference_raised)}{why}), where it ran with autograd "
                     "on and under no_grad: its outputs there were not compared")
    if candidate.changed_inputs:
        notes.append(f"the {cand_label}'s forward changed its input(s) "
                     f"{', '.join(candidate.changed_inputs)} in place; each model was given "
                     "its own copy, and the diff fails (a caller's tensors would be changed)")
        reasons.append("changes its inputs")
    if reference.changed_inputs:
        notes.append(f"the {ref_label}'s forward changed its input(s) "
                     f"{', '.join(reference.changed_inputs)} in place; each model was given "
                     "its own copy of the inputs")
    made = [call for call in (CALL_AUTOGRAD, CALL_NO_GRAD, CALL_INFERENCE)
            if any(r.call == call for r in rows)]
    fails = {call: [r for r in rows if r.call == call and r.status == STATUS_FAIL]
             for call in made}
    good = [call for call in made if not fails[call]]
    bad = [call for call in made if fails[call]]
    if good and bad and not changed:  # (a forward that changes from call to call: its
        worst = max(fails[bad[0]], key=_ratio)  # calls differ by their number, not a mode)
        shown = {CALL_AUTOGRAD: "with autograd on", CALL_NO_GRAD: "under no_grad",
                 CALL_INFERENCE: "under inference_mode"}
        notes.append(f"the {cand_label}'s outputs depend on the grad mode: "
                     f"{' and '.join(shown[c] for c in good)} they agree with the {ref_label}'s, "
                     f"{' and '.join(shown[c] for c in bad)} they do not "
                     f"({worst.reference_output} off by {_err(worst)}; a PyTorch fast path "
                     "or code that branches on torch.is_grad_enabled() or "
                     "torch.is_inference_mode_enabled())")
        reasons.append("grad mode")
    elif fails[CALL_AUTOGRAD]:
        reasons.append("outputs")
    nonfinite = [r for r in rows if r.nonfinite and r.call == CALL_AUTOGRAD]
    if nonfinite and not allow_nonfinite:
        names = ", ".join(r.reference_output for r in nonfinite)
        notes.append(f"NaN or Inf in the outputs ({names}): the diff fails")
    return notes, reasons


def _cut(text: str, most: int = 160) -> str:
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def _ratio(row: OutputDiff) -> float:
    if row.max_abs_err is None:
        return math.inf
    if row.nonfinite:
        return math.inf
    return row.max_abs_err / row.limit if row.limit else math.inf


def _err(row: OutputDiff) -> str:
    return "an unknown amount" if row.max_abs_err is None else f"{row.max_abs_err:.3g}"


def _shapes(outputs: Mapping[str, torch.Tensor]) -> str:
    if not outputs:
        return "nothing"
    return ", ".join(f"{name} {tuple(t.shape)}" for name, t in outputs.items())


__all__ = ["NoOutputPairs", "TruthVerdict", "compare_truths", "pair_outputs"]
