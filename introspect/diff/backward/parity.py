"""Gradient parity: where a port's backward parts from the reference's, node by node.

``backward_diff`` runs both models forward and backward once, for real, with one loss
(``backward_losses``), keeping the gradient of the loss with respect to every recorded
node's value (``backward_record``). The forward diff's alignment then says which
gradients to compare:

- **nodes**: every aligned pair's gradients (regions and layouts as in the forward);
- **local backward**: each pair's backward is run, on each side, by the very autograd
  functions its forward recorded (custom ``Function.backward``s, saved tensors changed in
  place and all), fed the *reference's* output gradient and stopped at the nearest
  aligned nodes; the candidate's input gradients are compared with the reference's. The
  functions hold each side's own saved values, so a node decides only where the forward
  diff found the values it reads equal within budget. A node whose local backward is
  over budget computes another backward: the first such node walking from the outputs
  toward the inputs is the first divergence (failing that, where the propagated
  gradient first leaves its budget: a hook or a scale outside the graph);
- **parameters**: every candidate weight's gradient against the reference weight it
  relates to (same, transposed, a slice, a fusion), and one SGD step from both sides.

Budgets are the forward's (``tolerance``), with ``atol`` taken relative to the
magnitude of the reference's gradient (gradients are small numbers; what rounds is
their relative size); with ``noise_budget`` a float64 reference's gradients bound the
noise per node and per parameter, as in the forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from introspect.diff.backward.hints import gradient_hints, untied_hint
from introspect.diff.backward.losses import default_loss, loss_kind
from introspect.diff.backward.record import (
    GradientConsumer,
    GradientRecording,
    GradientRun,
    LossFn,
    Shell,
    detached_outputs,
    record_backward,
    run_forward,
)
from introspect.diff.compare.layouts import fit_layout
from introspect.diff.copies import cast_copy
from introspect.diff.eager import outputs_as_dict
from introspect.diff.records import Pair, WeightRelation
from introspect.diff.status import status_word
from introspect.diff.tolerance import Budget, Tolerance
from introspect.errors import InputError
from introspect.run.random_state import random_state_of

if TYPE_CHECKING:
    import pandas

STATUS_OK, STATUS_DRIFT, STATUS_FAIL = "ok", "drift", "fail"
STATUS_NOT_COMPARED = "not compared"
_MAX_REGION = 64  # nodes walked back from a pair to the aligned nodes it reads
SGD_LR = 1e-3
# A gradient's rounding comes from the terms summed into it, not from the sum: one that
# cancels to nearly zero (a key bias: softmax ignores a shift) is measured against at least
# this share of the largest gradient of its kind.
FLOOR = 1e-2


@dataclass(frozen=True)
class GradientDiff:
    """One row of ``BackwardResult.nodes``: an aligned pair's gradients."""

    reference_node: str
    candidate_node: str
    module: str
    layer: str
    op: str
    shape: str
    max_abs_err: float | None  # propagated: each side's own backward
    max_rel_err: float | None
    reference_max_abs: float | None  # the reference gradient's largest magnitude
    local_max_abs_err: float | None  # this node's backward on the reference's values
    pad_max_abs_err: float | None  # at padded positions (tokens axis known only)
    atol: float | None  # |cand - ref| <= atol + rtol * |ref|, atol already scaled
    rtol: float | None
    status: str
    hint: str
    reference_index: int


@dataclass(frozen=True)
class ParameterGradient:
    """One row of ``BackwardResult.parameters``: a weight's gradient on both sides."""

    reference: str  # parameter path in the reference
    candidate: str  # parameter path(s) in the candidate ("a + b" when several)
    relation: str  # same, transposed, slice, fused, ...
    shape: str
    max_abs_err: float | None
    max_rel_err: float | None
    reference_max_abs: float
    sgd_max_abs_err: float | None  # the weights after one SGD step (lr SGD_LR)
    status: str
    hint: str


@dataclass(frozen=True)
class BackwardDivergence:
    """The first node (from the outputs) whose local backward is over budget, or a weight."""

    reference_node: str
    candidate_node: str
    module: str
    layer: str
    op: str
    local_max_abs_err: float
    budget: str
    hints: tuple[str, ...]
    parameter: str = ""  # set when the divergence is a weight's gradient, not a node's


@dataclass
class BackwardResult:
    """Gradient parity of a candidate against a reference (``DiffResult.backward``)."""

    passed: bool
    loss: str  # which loss ("masked-lm", "user", ...)
    reference_loss: float
    candidate_loss: float
    rows: list[GradientDiff]
    parameter_rows: list[ParameterGradient]
    first_divergence: BackwardDivergence | None
    sgd_max_abs_err: float
    notes: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows],
                            columns=list(GradientDiff.__dataclass_fields__))

    @property
    def parameters(self) -> pandas.DataFrame:
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.parameter_rows],
                            columns=list(ParameterGradient.__dataclass_fields__))

    def summary(self) -> str:
        verdict = "gradient parity holds" if self.passed else "gradient parity FAILS"
        failing = sum(r.status == STATUS_FAIL for r in self.parameter_rows)
        drifting = sum(r.status == STATUS_DRIFT for r in self.parameter_rows)
        drift = f", {drifting} drift" if drifting else ""
        lines = [f"backward ({self.loss} loss: reference {self.reference_loss:.6g}, candidate "
                 f"{self.candidate_loss:.6g}): {verdict}; {len(self.rows)} node gradients, "
                 f"{len(self.parameter_rows)} parameters ({failing} failing{drift}), one SGD "
                 f"step max abs error {self.sgd_max_abs_err:.3g}"]
        d = self.first_divergence
        if d is not None:
            where = f"parameter {d.parameter}" if d.parameter else \
                f"{d.reference_node} -> {d.candidate_node} ({d.op} in {d.module or d.layer})"
            lines.append(f"first backward divergence: {where}, max abs error "
                         f"{d.local_max_abs_err:.3g} over budget {d.budget}")
            lines += [f"  hint: {h}" for h in d.hints]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def parameter_table(self, limit: int = 0) -> str:
        """The parameter rows as fixed-width text (failing first when ``limit`` cuts)."""
        rows = sorted(self.parameter_rows, key=lambda r: r.status != STATUS_FAIL) if limit \
            else self.parameter_rows
        lines = [f"{'parameter':<48} {'max_abs_err':>11} {'max_rel':>9} {'status':<12} "
                 "candidate"]
        for r in rows[:limit or None]:
            lines.append(f"{r.reference:<48} {_num(r.max_abs_err):>11} {_num(r.max_rel_err):>9} "
                         f"{status_word(r.status):<12} {r.candidate}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        d = self.first_divergence
        return {"passed": self.passed, "loss": self.loss, "reference_loss": self.reference_loss,
                "candidate_loss": self.candidate_loss, "sgd_max_abs_err": self.sgd_max_abs_err,
                "first_divergence": asdict(d) if d is not None else None,
                "nodes": [asdict(r) for r in self.rows],
                "parameters": [asdict(r) for r in self.parameter_rows], "notes": self.notes}


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


# ---------------------------------------------------------------------------------------
# The comparison


def backward_diff(reference: torch.nn.Module, candidate: torch.nn.Module,
                  ref_inputs: Mapping[str, torch.Tensor], cand_inputs: Mapping[str, torch.Tensor],
                  alignment: Any, ref_graph: Any, cand_graph: Any, tolerance: Tolerance, *,
                  loss: LossFn | None = None, noise_budget: bool = False,
                  attention_mask: torch.Tensor | None = None,
                  forward_status: Mapping[str, str] | None = None,
                  allow_nonfinite: bool = False,
                  reference_gradients: GradientRecording | None = None,
                  candidate_run: GradientRun | None = None,
                  loss_inputs: Mapping[str, torch.Tensor] | None = None) -> BackwardResult:
    """Gradient parity on the forward diff's alignment (see the module's docstring).

    Args:
        reference, candidate: the two models (put in eval mode by the caller).
        ref_inputs, cand_inputs: each model's inputs, as the forward diff gave them.
        alignment, ref_graph, cand_graph: the forward diff's alignment and graphs.
        tolerance: the forward's budgets.
        loss: ``loss(outputs, inputs) -> scalar`` for both sides; None: the head's own.
        noise_budget: bound each gradient's noise by a float64 run of the reference.
        attention_mask: the padding (gradients at padded positions are measured apart).
        forward_status: the forward diff's status of each reference node ("ok", "drift",
            "fail"): a local backward decides only where the values it reads are "ok".
        allow_nonfinite: NaN or Inf in a loss or a gradient is compared as a value, not
            failed.
        reference_gradients: the reference's backward, run already on ``backward_loss``'s
            loss (the diff runs it right after the reference's recorded forward, before
            the candidate is built); None: run here.
        candidate_run: the candidate's forward, recorded with autograd on for the forward
            diff (``record_with_gradients``); its backward runs here. None: both run here.
        loss_inputs: what the loss is given (a copy at each call); None: both models'
            inputs.

    Raises:
        InputError: the reference's loss is NaN or Inf, or every gradient of the
            reference is zero (there is nothing to compare), or the loss fails.
    """
    inputs_for_loss = loss_inputs if loss_inputs is not None else {**cand_inputs, **ref_inputs}
    kind, loss_fn = backward_loss(reference, ref_inputs, loss, inputs_for_loss)
    ref = reference_gradients if reference_gradients is not None else \
        record_backward(reference, ref_inputs, loss_fn)
    noise: dict[str, float] = {}
    if noise_budget:
        noise = _gradient_noise(reference, candidate, ref_inputs, loss_fn, inputs_for_loss, ref)
    records = {r.name: r for r in ref_graph.records}
    cand_records = {r.name: r for r in cand_graph.records}
    again = None
    if not ref.values and ref.shells:  # its backward let the values go (the diff's memory)
        def again() -> GradientRecording:
            return reference_again(reference, ref_inputs, ref)
    if candidate_run is not None:
        # Compared as they come: each candidate gradient is measured against the
        # reference's inside autograd's hook and let go, never kept (memory: every node's
        # gradient of one side, the size of a forward's values and more). Its values go
        # too, but those a layout is fitted on: its backward frees each saved value as a
        # plain backward does, and a failing gradient's local backwards run its forward
        # again (``run_again``).
        forming = _Forming(candidate_run.recorder)
        comparer = _Comparer(ref, forming, alignment, records, cand_records, tolerance, noise,
                             attention_mask, allow_nonfinite, again)
        consumer = comparer.stream()
        candidate_run.let_values_go(comparer.candidate_values_needed())
        forming.shells = candidate_run.shells or {}
        cand = candidate_run.backward(loss_fn, detached_ok=True, consumer=consumer,
                                      keep_graph=False)
        comparer.cand = cand
        first_cand = cand

        def candidate_again() -> GradientRecording | None:
            return run_again(candidate, cand_inputs, first_cand)
        comparer.candidate_again = candidate_again
    else:
        cand = record_backward(candidate, cand_inputs, loss_fn, detached_ok=True)
        comparer = _Comparer(ref, cand, alignment, records, cand_records, tolerance, noise,
                             attention_mask, allow_nonfinite, again)
    notes = _loss_notes(kind, ref, cand, allow_nonfinite)
    if noise_budget:
        notes.append("the reference also ran forward and backward in float64; each gradient's "
                     f"budget is at least {tolerance.noise_factor:g}x its own noise")
    rows = comparer.node_rows()
    unexplained = False  # a failing gradient whose local backwards could not run
    params, sgd = _parameter_rows(ref, cand, reference, candidate, alignment, tolerance, noise,
                                  _weights_read_together(alignment, ref_graph.gm, cand_graph.gm),
                                  allow_nonfinite)
    if any(r.status == STATUS_DRIFT for r in rows) or any(p.status == STATUS_FAIL
                                                          for p in params):
        # Only a failing backward has a divergence to find: every gradient within budget,
        # no node's own backward can be the first over it, and none is run.
        cand_full = comparer.candidate()
        if cand_full is None:
            notes.append("the candidate's forward, run again for the local backwards of its "
                         "gradients, computed otherwise (other ops, or outputs not equal to "
                         "the bit): no local backward, and the backward diff fails")
            unexplained = True
        else:
            comparer.cand = cand_full
            local = _LocalBackward(ref_graph.gm, cand_graph.gm, comparer.reference(),
                                   cand_full, alignment, comparer, forward_status or {})
            rows = local.apply(rows)
    alias = _aliases(reference)
    read = {node: {alias.get(w, w) for w in weights}
            for node, weights in _weights_read(ref_graph.gm).items()}
    params = carried_in(params, rows, read, forward_status or {})
    mismatched = [name for name, target in ref.node_targets.items()
                  if name in records and records[name].op != target.split(":")[0]]
    if mismatched:
        notes.append(f"{len(mismatched)} node(s) of the reference ran other ops with autograd "
                     "on than in the forward diff; their gradients are left out")
    divergence = _first_divergence(rows, params, records, tolerance)
    passed = divergence is None and not any(r.status == STATUS_FAIL for r in rows) \
        and not any(r.status in (STATUS_FAIL, STATUS_DRIFT) for r in params) \
        and (allow_nonfinite or math.isfinite(cand.loss)) and not cand.detached \
        and not unexplained
    if not math.isclose(ref.loss, cand.loss, rel_tol=1e-4, abs_tol=1e-6):
        notes.append(f"the two losses differ: reference {ref.loss:.6g}, candidate "
                     f"{cand.loss:.6g}")
    return BackwardResult(passed, kind, ref.loss, cand.loss, rows, params, divergence, sgd,
                          notes)


def run_again(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
              first: GradientRecording) -> GradientRecording | None:
    """``model``'s forward once more, recorded with autograd on, its graph kept: the values
    and autograd functions its first backward let go, beside that backward's gradients.
    None where it is not the same run: other nodes or ops, or outputs not equal to the bit.
    """
    from introspect.run.truth import identical

    with random_state_of(first.random_state):  # dropout draws what it drew
        run = run_forward(model, inputs)
    run.recorder.unhook()  # no backward runs on it: a local backward calls each function
    outputs = outputs_as_dict(detached_outputs(run.outputs))
    moved = [name for name, value in first.outputs.items() if isinstance(value, torch.Tensor)
             and not identical(value, outputs.get(name))]
    if run.recorder.targets != first.node_targets or moved:
        return None
    recorder = run.recorder
    return GradientRecording(recorder.values, first.grads, recorder.requires_grad,
                             first.parameter_grads, first.parameters, first.loss,
                             first.outputs, first.node_targets, recorder.tensors,
                             recorder.edges, first.detached, first.shells)


def reference_again(reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                    first: GradientRecording) -> GradientRecording:
    """``run_again`` for the reference. It runs after the candidate was built, so a
    reference that computes otherwise then is no reference.

    Raises:
        ReferenceChanged: it is not the same run (the candidate changed what the
            reference computes).
    """
    from introspect.diff.truth import ReferenceChanged

    found = run_again(reference, inputs, first)
    if found is None:
        raise ReferenceChanged(
            "the candidate changed what the reference computes: run again after the "
            "candidate ran (for the local backwards of its gradients), it ran other ops or "
            "its outputs moved (a patched torch function or Tensor method, a registered "
            "kernel, a module global both import); no verdict")
    return found


def backward_loss(reference: torch.nn.Module, ref_inputs: Mapping[str, torch.Tensor],
                  loss: LossFn | None, inputs: Mapping[str, torch.Tensor]) -> tuple[str, LossFn]:
    """The loss's kind and the loss both sides run: the user's, or the head's own
    (``losses``), each call on its own copy of ``inputs``."""
    kind = "user" if loss is not None else loss_kind(reference, ref_inputs)
    return kind, _on_copies(loss if loss is not None else default_loss(kind), inputs)


def _on_copies(loss_fn: LossFn, inputs: Mapping[str, torch.Tensor]) -> LossFn:
    """The loss, given its own copy of the inputs at each call: a loss that edits them in
    place (``labels[mask == 0] = -100``) cannot change what the other side or model sees."""
    def loss(outputs: Any, _: Any) -> torch.Tensor:
        copies = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return loss_fn(outputs, copies)

    loss.__name__ = getattr(loss_fn, "__name__", "loss")
    return loss


def _loss_notes(kind: str, ref: GradientRecording, cand: GradientRecording,
                allow_nonfinite: bool) -> list[str]:
    """Refuse a loss that leaves nothing to compare; say what fails on the candidate's side.

    A NaN or Inf loss makes every gradient NaN or Inf (or zero), and all-zero gradients
    (a loss times 0) agree with anything: either would let any port pass.
    """
    if not math.isfinite(ref.loss) and not allow_nonfinite:
        raise InputError(f"the reference's {kind} loss is {ref.loss}: its gradients compare "
                         "nothing; check the loss and the inputs (or pass --allow-nonfinite "
                         "to compare them anyway)")
    if math.isfinite(ref.loss) and not _any_gradient(ref):
        raise InputError(f"every gradient of the reference's {kind} loss is zero (a loss that "
                         "does not depend on the outputs, or one multiplied by 0): a backward "
                         "diff would compare nothing; give a loss that depends on the outputs")
    notes = []
    if not math.isfinite(cand.loss):
        notes.append(f"the candidate's loss is {cand.loss} (the reference's: {ref.loss:.6g})"
                     + ("; allowed by --allow-nonfinite" if allow_nonfinite
                        else ": the backward diff fails"))
    if cand.detached:
        notes.append("the candidate's loss does not depend on its parameters (its forward "
                     "ran under no_grad, or detached its outputs): no gradient reaches it, "
                     "the backward diff fails")
    return notes


def _any_gradient(recording: GradientRecording) -> bool:
    grads = [*recording.grads.values(),
             *(g for g in recording.parameter_grads.values() if g is not None)]
    return any(bool((g != 0).any()) for g in grads if g.numel())


def _gradient_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                    ref_inputs: Mapping[str, torch.Tensor], loss_fn: LossFn,
                    inputs_for_loss: Mapping[str, torch.Tensor],
                    ref: GradientRecording) -> dict[str, float]:
    """Per node and per parameter: |gradient in the candidate's dtype - in float64|."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()),
                 torch.float32)
    exact_model = cast_copy(reference, torch.float64, what="backward noise").eval()
    exact = record_backward(exact_model, ref_inputs, loss_fn)
    if dtype != next((p.dtype for p in reference.parameters()), dtype):
        low_model = cast_copy(reference, dtype, what="backward noise").eval()
        ref = record_backward(low_model, ref_inputs, loss_fn)
    noise: dict[str, float] = {}
    for name, node_grad in ref.grads.items():
        e = exact.grads.get(name)
        if e is not None and e.shape == node_grad.shape:
            noise[name] = float((node_grad.double() - e).abs().max()) \
                if node_grad.numel() else 0.0
    for name, g in ref.parameter_grads.items():
        e = exact.parameter_grads.get(name)
        if g is not None and e is not None and e.shape == g.shape:
            noise[f"param:{name}"] = float((g.double() - e).abs().max())
    return noise


def _budget(tolerance: Tolerance, dtype: torch.dtype, scale: float, noise: float | None) -> Budget:
    """The forward's budget for ``dtype``, its atol relative to the gradient's magnitude."""
    base = tolerance.budget(str(dtype).removeprefix("torch."))
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
        # graph, for the values a layout is fitted on and for the local backwards.
        self._again = again
        self._ran_again: GradientRecording | None = None
        # Where the candidate's backward let its graph go: its forward again (None: it
        # computed otherwise), for the local backwards.
        self.candidate_again: Callable[[], GradientRecording | None] | None = None
        self._cand_again: list[GradientRecording | None] = []
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
        if self.ref.values or self._again is None or not self.ref.shells:
            return self.ref
        if self._ran_again is None:
            self._ran_again = self._again()
        return self._ran_again

    def reference_value(self, name: str) -> torch.Tensor:
        return self.reference().values[name]

    def candidate(self) -> GradientRecording | None:
        """The candidate's recording with its values and autograd graph: the one given,
        or its forward run again where its backward let them go (None: that run was not
        the same)."""
        if self.candidate_again is None:
            return self.cand if isinstance(self.cand, GradientRecording) else None
        if not self._cand_again:
            self._cand_again.append(self.candidate_again())
        return self._cand_again[0]

    def _cand_shape(self, name: str) -> torch.Size | None:
        value = self.cand.values.get(name)
        if value is not None:
            return value.shape
        shell = self.cand.shells.get(name)
        return None if shell is None else shell.shape

    def candidate_values_needed(self) -> set[str]:
        """The candidate nodes whose values a layout is fitted on (``needs_values``)."""
        return {pair.candidate for indices in self._by_candidate.values() for pair in
                (self.alignment.pairs[i] for i in indices) if self.needs_values(pair)}

    def needs_values(self, pair: Pair) -> bool:
        """Whether bringing the pair's candidate gradient to the reference's layout fits a
        layout on both values (their shapes differ once regions and orders are taken)."""
        shell, own = self.ref.shells.get(pair.reference), self._cand_shape(pair.candidate)
        if shell is None or own is None:
            return False
        shape = list(own)
        if pair.candidate_region is not None:
            shape[pair.candidate_region.dim] = pair.candidate_region.stop - \
                pair.candidate_region.start
        return tuple(shape) != _narrowed(shell.shape, pair.reference_region)

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
            order = torch.tensor(pair.feature_order)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel())
            cand_value = cand_value[..., inverse]
            own = None if own is None else own[..., inverse]
        if tuple(cand_value.shape) == _narrowed(shell.shape, pair.reference_region):
            return cand_value
        if own is None:  # never: ``candidate_values_needed`` kept it
            return None
        key = (pair.reference, pair.candidate)
        if key not in self.layouts:
            self.layouts[key] = fit_layout(
                own, self._ref_view(pair, self.reference_value(pair.reference)))
        layout = self.layouts[key]
        return None if layout is None else layout.to_reference(cand_value)

    def to_candidate(self, pair: Pair, ref_value: torch.Tensor) -> torch.Tensor | None:
        """A reference tensor in ``pair.candidate``'s layout (plain pairs only)."""
        own = self.cand.values.get(pair.candidate)
        if own is None or not self.plain(pair):
            return None
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
        mask = self.mask
        if mask is None or mask.ndim != 2 or bool(mask.all()) or len(shape) < 2 \
                or tuple(shape[:2]) != tuple(mask.shape):
            return None
        pad = (mask == 0).reshape(*mask.shape, *([1] * (len(shape) - 2)))
        return pad.expand(*shape)

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
        run inside the candidate's backward."""
        self._by_candidate = {}
        for index, pair in enumerate(self.alignment.pairs):
            if pair.reference in self.records:
                self._by_candidate.setdefault(pair.candidate, []).append(index)
        if any(self.needs_values(self.alignment.pairs[i]) for indices in
               self._by_candidate.values() for i in indices):
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
        scale = self.magnitude(pair.reference) if whole else \
            magnitude_of(g_ref)
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


# ---------------------------------------------------------------------------------------
# Local backward


class _LocalBackward:
    """Each pair's backward on the reference's values and output gradient."""

    def __init__(self, ref_gm: torch.fx.GraphModule, cand_gm: torch.fx.GraphModule,
                 ref: GradientRecording, cand: GradientRecording, alignment: Any,
                 comparer: _Comparer, forward_status: Mapping[str, str]) -> None:
        self.forward_status = forward_status
        self.ref, self.cand = ref, cand
        self.comparer = comparer
        plain = [p for p in alignment.pairs if comparer.plain(p)]
        counts: dict[str, int] = {}
        for p in alignment.pairs:
            counts[p.candidate] = counts.get(p.candidate, 0) + 1
            counts["\x00" + p.reference] = counts.get("\x00" + p.reference, 0) + 1
        # Pairs one to one: the frontier of a local backward.
        self.by_cand = {p.candidate: p for p in plain if counts[p.candidate] == 1}
        self.by_ref = {p.reference: p for p in plain if counts["\x00" + p.reference] == 1
                       and p.candidate in self.by_cand}
        self.ref_nodes = {n.name: n for n in ref_gm.graph.nodes}
        self.cand_nodes = {n.name: n for n in cand_gm.graph.nodes}

    def apply(self, rows: list[GradientDiff]) -> list[GradientDiff]:
        """Each pair's local backward, walking from the outputs toward the inputs, up to
        the first one over budget: that pair is the divergence (``_first_divergence``
        takes the failing pair nearest the outputs), the pairs behind it keep their
        propagated status. A pair whose forward inputs already differ cannot decide
        (its backward runs on its own saved values) and is passed by."""
        out = list(rows)
        for i in sorted(range(len(rows)), key=lambda i: rows[i].reference_index, reverse=True):
            row = rows[i]
            pair = self.by_ref.get(row.reference_node)
            if pair is None or row.status == STATUS_NOT_COMPARED \
                    or pair.candidate != row.candidate_node or not self.decisive(pair):
                continue
            try:
                found = self.local(pair)
            except Exception as e:  # an op that cannot run again in isolation
                out[i] = _replace(row, hint=(row.hint + "; " if row.hint else "")
                                  + f"local backward not run ({type(e).__name__}: {e})")
                continue
            if found is None:
                continue
            err, over, hints, _ = found
            out[i] = _replace(row, local_max_abs_err=err,
                              status=STATUS_FAIL if over else row.status,
                              hint="; ".join(hints) if over else row.hint)
            if over:
                break
        return out

    def decisive(self, pair: Pair) -> bool:
        """The forward diff found every aligned value the pair's backward reads equal: the
        candidate's backward runs on its own saved values, so only then does it decide."""
        node = self.ref_nodes.get(pair.reference)
        if node is None:
            return False
        frontier = self._frontier(node, lambda n: n in self.by_ref)
        return frontier is not None and all(
            self.forward_status.get(name, STATUS_OK) == STATUS_OK
            for name in frontier if name in self.ref.tensors)

    def local(self, pair: Pair) -> tuple[float, bool, list[str], list[str]] | None:
        g_out = self.ref.grads.get(pair.reference)
        if g_out is None:
            return None
        ref_node, cand_node = self.ref_nodes.get(pair.reference), \
            self.cand_nodes.get(pair.candidate)
        if ref_node is None or cand_node is None or ref_node.op in ("placeholder", "output") \
                or cand_node.op in ("placeholder", "output"):
            return None
        ref_grads = self._vjp(ref_node, self.ref, g_out,
                              lambda n: n in self.by_ref)
        g_cand = self.comparer.to_candidate(pair, g_out)
        if g_cand is None or ref_grads is None:
            return None
        cand_grads = self._vjp(cand_node, self.cand, g_cand,
                               lambda n: n in self.by_cand)
        if cand_grads is None:
            return None
        worst, over, hints = 0.0, False, []
        frontier = {**{self.by_cand[c].reference: g for c, g in cand_grads.items()}}
        for name in dict.fromkeys([*ref_grads, *frontier]):
            front_pair = self.by_ref.get(name)
            if front_pair is None:
                continue
            g_ref = ref_grads.get(name)
            g_c = frontier.get(name)
            value = self.ref.values[name]
            g_ref = torch.zeros_like(value) if g_ref is None else g_ref
            if g_c is None:
                g_c_ref = torch.zeros_like(value)
            else:
                mapped = self.comparer.to_reference(front_pair, g_c)
                if mapped is None or mapped.shape != g_ref.shape:
                    continue
                g_c_ref = mapped
            scale = max(float(g_ref.abs().max()) if g_ref.numel() else 0.0,
                        FLOOR * float(g_out.abs().max()))
            budget = _budget(self.comparer.tolerance, g_ref.dtype, scale, None)
            err, _, bad, _ = _errors(g_c_ref, g_ref, budget,
                                     allow_nonfinite=self.comparer.allow_nonfinite)
            worst = max(worst, err)
            if bad:
                over = True
                pad = self.comparer.pad_for(g_ref.shape)
                hints += gradient_hints(g_c_ref, g_ref, pad, cut=g_c is None,
                                        where=f"the gradient into {name}")
        return worst, over, list(dict.fromkeys(hints)), list(ref_grads)

    @staticmethod
    def _frontier(node: torch.fx.Node, is_frontier: Any) -> list[str] | None:
        """The aligned nodes ``node`` reads, through the nodes with no counterpart."""
        frontier: list[str] = []
        seen: set[str] = set()
        stack = list(node.all_input_nodes)
        while stack:
            n = stack.pop()
            if n.name in seen:
                continue
            seen.add(n.name)
            if is_frontier(n.name):
                frontier.append(n.name)
            elif n.op not in ("placeholder", "get_attr"):
                if len(seen) > _MAX_REGION:
                    return None
                stack.extend(n.all_input_nodes)
        return frontier

    def _vjp(self, node: torch.fx.Node, side: GradientRecording, g_out: torch.Tensor,
             is_frontier: Any) -> dict[str, torch.Tensor | None] | None:
        """``node``'s own backward, run by autograd's recorded functions, back to the
        aligned nodes it reads (``_run_backward``)."""
        frontier = self._frontier(node, is_frontier)
        out = side.tensors.get(node.name)
        root = side.edges.get(node.name)
        if frontier is None or out is None or root is None:
            return None
        stops = {side.edges[name]: name for name in frontier if name in side.edges}
        found = _run_backward(root, g_out.to(out.dtype), stops)
        if found is None:
            return None
        return {name: found.get(name) for name in frontier if name in side.tensors}


_MAX_FUNCTIONS = 400  # autograd functions one local backward may run


def _run_backward(start: tuple[Any, int], g_out: torch.Tensor,
                  stops: Mapping[tuple[Any, int], str]) -> dict[str, torch.Tensor] | None:
    """Run autograd's functions from ``start`` (a value's edge) back to ``stops``, no further.

    ``torch.autograd.grad`` would give total derivatives: a gradient reaching an aligned
    node through another aligned node (a residual add reads x and f(x)) would carry f's
    backward too, and a bug in f would show at the add. Here each function of the graph
    kept by the recording is called directly (with the saved tensors of the real forward,
    custom ``Function.backward``s and all), stopping at the aligned nodes' edges, so the
    gradient into each of them is the local one. Returns None where the region between
    is too large (the stops do not cut ``out`` from the rest of the graph).
    """
    if start in stops:
        # The node's value is the very value of an aligned node it reads (dropout in eval,
        # ``contiguous`` of a contiguous tensor return their input): its backward is the
        # identity. Walking on from here would run the input's own backward instead, and
        # everything behind it, and collect nothing.
        return {stops[start]: g_out}
    root, root_nr = start
    stop_nodes = {node for node, _ in stops}
    region: dict[Any, int] = {}  # autograd node -> inputs from within the region
    order = [root]
    region[root] = 0
    i = 0
    while i < len(order):
        fn = order[i]
        i += 1
        for next_fn, _ in fn.next_functions:
            if next_fn is None or next_fn in stop_nodes or _is_sink(next_fn):
                continue
            if next_fn not in region:
                if len(region) >= _MAX_FUNCTIONS:
                    return None
                region[next_fn] = 0
                order.append(next_fn)
            region[next_fn] += 1
    pending: dict[Any, list[torch.Tensor | None]] = {root: [None] * root_nr + [g_out]}
    ready = [root]
    collected: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        while ready:
            fn = ready.pop()
            grads = pending.pop(fn, [])
            n_edges = len(fn.next_functions)
            results = _call(fn, grads) if any(g is not None for g in grads) \
                else (None,) * n_edges
            for (next_fn, nr), g in zip(fn.next_functions, results, strict=False):
                if next_fn is None:
                    continue
                if g is not None:
                    g = _as_input(next_fn, nr, g)
                if (next_fn, nr) in stops:
                    if g is not None:
                        name = stops[(next_fn, nr)]
                        collected[name] = g if name not in collected else collected[name] + g
                    continue
                if next_fn in stop_nodes or _is_sink(next_fn) or next_fn not in region:
                    continue
                if g is not None:
                    slots = pending.setdefault(next_fn, [])
                    while len(slots) <= nr:
                        slots.append(None)
                    slots[nr] = g if slots[nr] is None else slots[nr] + g
                region[next_fn] -= 1
                if region[next_fn] == 0:
                    ready.append(next_fn)
    return collected


def _as_input(fn: Any, nr: int, g: torch.Tensor) -> torch.Tensor:
    """What autograd's engine does between two functions: sum a broadcast gradient back
    to the input's shape, cast it to the input's dtype."""
    metadata = getattr(fn, "_input_metadata", None)
    if not metadata or nr >= len(metadata):
        return g
    shape, dtype = tuple(metadata[nr].shape), metadata[nr].dtype
    if tuple(g.shape) != shape:
        g = g.sum_to_size(shape)
    return g if g.dtype == dtype else g.to(dtype)


def _is_sink(fn: Any) -> bool:
    """A parameter's or input's gradient accumulator: never called (it writes .grad)."""
    return type(fn).__name__ == "AccumulateGrad"


def _call(fn: Any, grads: list[torch.Tensor | None]) -> Sequence[torch.Tensor | None]:
    """One autograd function's backward on ``grads`` (missing ones as zeros of no shape)."""
    outputs = fn.apply(*grads) if hasattr(fn, "_forward_cls") else fn(*grads)
    if isinstance(outputs, torch.Tensor) or outputs is None:
        return (outputs,)
    return tuple(outputs)


def _replace(row: GradientDiff, **changes: Any) -> GradientDiff:
    from dataclasses import replace

    return replace(row, **changes)


# ---------------------------------------------------------------------------------------
# Parameters


def _weights_read(gm: torch.fx.GraphModule) -> dict[str, set[str]]:
    """fx node name -> the parameters it reads (its module's, or fetched by get_attr)."""
    modules = dict(gm.named_modules())
    read: dict[str, set[str]] = {}
    for node in gm.graph.nodes:
        found = {str(n.target) for n in node.all_input_nodes if n.op == "get_attr"}
        if node.op == "call_module" and str(node.target) in modules:
            found |= {f"{node.target}.{p}" for p, _ in
                      modules[str(node.target)].named_parameters()}
        if found:
            read[node.name] = found
    return read


def _weights_read_together(alignment: Any, reference: torch.fx.GraphModule,
                           candidate: torch.fx.GraphModule) -> set[tuple[str, str]]:
    """(reference weight, candidate weight) read by a pair of aligned nodes: the relations
    the forward's alignment confirms, beyond equal values (zero biases are all equal)."""
    ref_read, cand_read = _weights_read(reference), _weights_read(candidate)
    return {(r, c) for pair in alignment.pairs for r in ref_read.get(pair.reference, ())
            for c in cand_read.get(pair.candidate, ())}


def _parameter_rows(ref: GradientRecording, cand: GradientRecording,
                    reference: torch.nn.Module, candidate: torch.nn.Module, alignment: Any,
                    tolerance: Tolerance, noise: Mapping[str, float],
                    together: set[tuple[str, str]] | None = None,
                    allow_nonfinite: bool = False) -> tuple[list[ParameterGradient], float]:
    """One row per reference parameter read by an aligned weight, and the SGD step.

    Where several candidate weights hold a reference weight's values (random init leaves
    every bias at zero), those that aligned nodes read together with it are its partners;
    the gradients never choose (a wrong gradient that fits another weight would pass).
    """
    ref_alias = _aliases(reference)
    cand_alias = _aliases(candidate)
    read_together = {(ref_alias.get(r, r), cand_alias.get(c, c)) for r, c in together or ()}
    by_ref: dict[str, list[tuple[str, WeightRelation]]] = {}
    for relation in alignment.relations:
        r_name, c_name = ref_alias.get(relation.reference), cand_alias.get(relation.candidate)
        if r_name is None or c_name is None:
            continue
        found = by_ref.setdefault(r_name, [])
        if all(c != c_name for c, _ in found):
            found.append((c_name, relation))
    rows, sgd = [], 0.0
    largest = max((magnitude_of(g) for g in ref.parameter_grads.values()
                   if g is not None and g.numel()), default=0.0)
    for r_name in ref.parameters:
        related = by_ref.get(r_name)
        g_ref = ref.parameter_grads.get(r_name)
        weight = ref.parameters[r_name]
        if not related:
            continue
        if g_ref is None:
            g_ref = torch.zeros_like(weight)
        scale = magnitude_of(g_ref)
        budget = _budget(tolerance, g_ref.dtype, max(scale, FLOOR * largest),
                         noise.get(f"param:{r_name}"))
        mapped: list[tuple[str, WeightRelation, torch.Tensor]] = []
        for c, relation in related:
            g = _to_reference(cand.parameter_grads.get(c), cand.parameters[c], relation, weight)
            if g is not None:
                mapped.append((c, relation, g))
        if not mapped:
            continue
        confirmed = [m for m in mapped if (r_name, m[0]) in read_together]
        mapped = confirmed or mapped
        # Several candidate weights for one reference weight: each is a copy (untied) or a
        # part; compare the one that fits best, and the sum of the copies.
        scored = mapped if len(mapped) == 1 else sorted(
            mapped, key=lambda m: float((m[2].double() - g_ref.double()).abs().max()))
        c_name, relation, g_c = scored[0]
        err, rel, over, _ = _errors(g_c, g_ref, budget, allow_nonfinite=allow_nonfinite)
        hint = ""
        names = c_name
        if over:
            hint = "; ".join(gradient_hints(g_c, g_ref, None, cut=cand.parameter_grads.get(
                c_name) is None, where=f"{r_name}'s gradient", weight=True))
            copies = [m for m in mapped if m[1].region is None]
            if len(copies) > 1:
                total = torch.stack([m[2].double() for m in copies]).sum(dim=0)
                t_err, _, t_over, _ = _errors(total, g_ref, budget,
                                              allow_nonfinite=allow_nonfinite)
                if not t_over:
                    hint = untied_hint(r_name, [m[0] for m in copies])
                    names = " + ".join(m[0] for m in copies)
        w_cand = _to_reference(cand.parameters[c_name], cand.parameters[c_name], relation,
                               weight) if err else None
        step = 0.0 if not err and cand.parameters[c_name].shape == weight.shape \
            and torch.equal(cand.parameters[c_name], weight) else None
        if w_cand is not None:
            step = _sgd_step_error(weight, g_ref, w_cand, g_c)
            sgd = max(sgd, step)
        rows.append(ParameterGradient(r_name, names, relation.kind, str(tuple(g_ref.shape)),
                                      err, rel, scale, step, STATUS_FAIL if over else STATUS_OK,
                                      hint))
    return rows, sgd


_STEP_CHUNK = 1 << 20  # values per float64 slice of the SGD step (an embedding: 23M)


def _sgd_step_error(w_ref: torch.Tensor, g_ref: torch.Tensor, w_cand: torch.Tensor,
                    g_cand: torch.Tensor) -> float:
    """max |(w_cand - lr g_cand) - (w_ref - lr g_ref)|, in float64, a slice at a time:
    four float64 copies of a word embedding at once were the diff's peak of memory."""
    if not w_ref.numel():
        return 0.0
    flat = [t.reshape(-1) for t in (w_ref, g_ref, w_cand, g_cand)]
    worst = 0.0
    for start in range(0, flat[0].numel(), _STEP_CHUNK):
        w_r, g_r, w_c, g_c = (t[start:start + _STEP_CHUNK].double() for t in flat)
        part = float(((w_c - SGD_LR * g_c) - (w_r - SGD_LR * g_r)).abs().max())
        if part != part:  # NaN: the whole step's error is NaN, as one max would say
            return part
        worst = max(worst, part)
    return worst


def carried_in(params: Sequence[ParameterGradient], rows: Sequence[GradientDiff],
               weights_read: Mapping[str, set[str]],
               forward_status: Mapping[str, str]) -> list[ParameterGradient]:
    """Weights over budget whose error was carried in are ``drift``, as in the forward.

    A weight's gradient sums, over the nodes that read it, each one's input times its
    output gradient: when none of them computes its own backward over budget, and at one
    at least the output gradient (the node's row drifts) or the forward values (the
    forward diff's status) already differ, the difference came from elsewhere. Drift
    still fails the backward; it says "look nearer the loss, or in the forward", not
    "look here".
    """
    readers: dict[str, list[str]] = {}
    for node, weights in weights_read.items():
        for weight in weights:
            readers.setdefault(weight, []).append(node)
    by_node = {r.reference_node: r for r in rows}
    marked = []
    for p in params:
        nodes = [by_node.get(n) for n in readers.get(p.reference, ())]
        found = [r for r in nodes if r is not None]
        carried = p.status == STATUS_FAIL and len(found) == len(nodes) > 0 \
            and not any(r.status == STATUS_FAIL for r in found) \
            and any(r.status == STATUS_DRIFT
                    or forward_status.get(r.reference_node, STATUS_OK) != STATUS_OK
                    for r in found)
        marked.append(_replace_parameter(p, status=STATUS_DRIFT) if carried else p)
    return marked


def _replace_parameter(row: ParameterGradient, **changes: Any) -> ParameterGradient:
    from dataclasses import replace

    return replace(row, **changes)


def _aliases(model: torch.nn.Module) -> dict[str, str]:
    """Every name a parameter is reachable under -> its first name (tied weights: one)."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters():
        first.setdefault(id(p), name)
    return {name: first[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}


def _to_reference(g: torch.Tensor | None, param: torch.Tensor, relation: WeightRelation,
                  ref_weight: torch.Tensor) -> torch.Tensor | None:
    """A candidate parameter's tensor brought to the reference weight's shape and order."""
    if g is None:
        g = torch.zeros_like(param)
    kind = relation.kind
    if "transposed" in kind and g.ndim == 2:
        g = g.t()
    region = relation.region
    if kind.startswith("fused") and region is not None:
        g = g.narrow(0, region.start, region.stop - region.start) if g.ndim >= 1 else g
    if kind == "permuted" and relation.order is not None:
        order = torch.tensor(relation.order)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        g = g[inverse]
    if "slice" in kind:
        return None  # a part of the reference's weight: compared through the fused rows
    if g.shape != ref_weight.shape:
        return g.reshape(ref_weight.shape) if g.numel() == ref_weight.numel() else None
    return g


def _first_divergence(rows: Sequence[GradientDiff], params: Sequence[ParameterGradient],
                      records: Mapping[str, Any], tolerance: Tolerance,
                      ) -> BackwardDivergence | None:
    """Walking from the outputs toward the inputs: the first failing node, else weight."""
    failing = [r for r in rows if r.status == STATUS_FAIL]
    if failing:
        r = max(failing, key=lambda row: row.reference_index)
        return BackwardDivergence(r.reference_node, r.candidate_node, r.module, r.layer, r.op,
                                  r.local_max_abs_err or 0.0,
                                  f"atol {tolerance.budget('float32').atol:.3g} x the gradient's "
                                  f"magnitude + rtol {tolerance.budget('float32').rtol:.3g} "
                                  "* |ref|", tuple(h for h in r.hint.split("; ") if h))
    bad = [p for p in params if p.status in (STATUS_FAIL, STATUS_DRIFT)]
    drifting = [r for r in rows if r.status == STATUS_DRIFT]
    if bad and drifting:  # where the gradient first left its budget, from the outputs
        r = max(drifting, key=lambda row: row.reference_index)
        hints = tuple(h for h in r.hint.split("; ") if h) + (
            "every aligned node's own backward is within budget here: the gradient changed "
            "outside the ops between aligned nodes (a tensor hook, a saved tensor changed in "
            "place through .data, a scale applied outside the graph)",)
        return BackwardDivergence(r.reference_node, r.candidate_node, r.module, r.layer, r.op,
                                  r.max_abs_err or 0.0, f"atol {r.atol:.3g} + rtol {r.rtol:.3g}"
                                  " * |ref|", hints)
    if bad:
        p = bad[-1]  # parameters in the reference's order: the last is nearest the outputs
        module = p.reference.rsplit(".", 1)[0]
        return BackwardDivergence("", p.candidate, module, "", "parameter", p.max_abs_err or 0.0,
                                  f"atol {tolerance.budget('float32').atol:.3g} x the gradient's "
                                  "magnitude", tuple(h for h in p.hint.split("; ") if h),
                                  parameter=p.reference)
    return None


__all__ = ["BackwardDivergence", "BackwardResult", "GradientDiff", "ParameterGradient",
           "backward_diff", "backward_loss"]
