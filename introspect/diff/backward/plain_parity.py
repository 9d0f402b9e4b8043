"""A backward PASS from the user's own backward, with nothing recorded.

``judge_plain_gradients`` reads the two sides' own backwards (``backward.plain``) and what
their modules' outputs were handed in them (``Leaf.grad``). It proves a PASS, or says why
it cannot, and then the recorded path decides (``backward.parity``). It proves a FAIL only
from weights paired by proof whose gradients are over budget (or a candidate loss that no
weight's gradient reaches), which stands against the recorded path, and decides where that
path cannot record the candidate (``flow.gradients.compare_gradients``). For a PASS:

- **the loss**: each side's, finite, equal within ``rel_tol`` 1e-4;
- **each weight**: every candidate weight paired with the one reference weight it holds
  (equal, or transposed), where several of the reference's hold its values (zero biases,
  LayerNorms at one) the one that module evidence paired its module with; every
  reference weight that has a gradient held by exactly one. Each gradient within the
  budget the recorded path gives it (``measure._budget``: the forward's, relative to its
  magnitude, at least ``FLOOR`` of the largest);
- **each module's output**: the gradient the candidate's module output was handed against
  the one the reference's value it was paired with was handed (module evidence's pairs),
  within the same kind of budget, padded positions apart.

Anything else (a fused or sliced weight, a frozen one, a gradient over budget, one a
backward edited in place, a loss that differs) is "not proven": the full path records
both sides and compares every node's gradient, with its local backwards.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from introspect.diff.backward.hints import gradient_hints
from introspect.diff.backward.measure import (
    FLOOR,
    _budget,
    _errors,
    magnitude_of,
    padded_positions,
)
from introspect.diff.backward.parity import _loss_notes, _sgd_step_error, _to_reference
from introspect.diff.backward.parting import handed_hint, weight_hint, where_gradients_part
from introspect.diff.backward.plain import PlainGradients
from introspect.diff.backward.results import (
    STATUS_FAIL,
    STATUS_OK,
    BackwardDivergence,
    BackwardResult,
    ParameterGradient,
)
from introspect.diff.backward.slices import Slice, find_slices
from introspect.diff.backward.untrained import never_trained
from introspect.diff.modules.evidence import ModuleEvidence, ReferenceLayers
from introspect.diff.ops.align.weights import folds_between
from introspect.diff.records import Region, WeightRelation
from introspect.diff.tolerance import Tolerance
from introspect.run.capture import Leaf, ModuleCall
from introspect.run.truth import AUTOGRAD

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-6  # as ``parity`` notes two losses that differ


@dataclasses.dataclass
class PlainVerdict:
    """A backward PASS proven from the own backwards (``result``), or why not (``why``);
    ``failing``: the FAIL they prove (weights paired by proof over budget, or a candidate
    loss that reaches no weight), whatever the recorded path finds."""

    result: BackwardResult | None
    why: str = ""
    failing: BackwardResult | None = None


def judge_plain_gradients(kind: str, reference: PlainGradients, candidate: PlainGradients,
                          evidence: ModuleEvidence, reference_model: torch.nn.Module,
                          tolerance: Tolerance, attention_mask: torch.Tensor | None,
                          allow_nonfinite: bool = False,
                          noise: Mapping[str, float] | None = None) -> PlainVerdict:
    """See the module's docstring. ``evidence``: module evidence judged with its calls
    kept (its ``pairs``, whose leaves hold the gradients). ``noise``: each reference
    weight's rounding noise (``parity.gradient_noise``, "param:NAME"): its budget is at
    least ``tolerance.noise_factor`` times it. Raises ``InputError`` where the reference's
    loss compares nothing (NaN, or every gradient zero), as the recorded path does."""
    notes = _loss_notes(kind, reference, candidate, allow_nonfinite)  # (its refusals first)
    if notes:  # the candidate's loss NaN, or no gradient reaching it: a FAIL as recorded
        pairs, _ = _weight_pairs(reference, candidate, evidence)
        rows, sgd = _parameter_rows(reference, candidate, pairs, tolerance, allow_nonfinite,
                                    noise)
        over = [r for r in rows if r.status == STATUS_FAIL]
        divergence = _divergence(over[-1], reference_model) if over else None
        return PlainVerdict(None, notes[0], BackwardResult(
            False, kind, reference.loss, candidate.loss, [], rows, divergence, sgd, notes,
            by_budget=False))
    if not (math.isfinite(reference.loss) and math.isfinite(candidate.loss)) or \
            not math.isclose(reference.loss, candidate.loss, rel_tol=LOSS_RTOL,
                             abs_tol=LOSS_ATOL):
        return PlainVerdict(None, f"the losses differ ({reference.loss:.6g}, "
                                  f"{candidate.loss:.6g})")
    untrained = never_trained(reference, candidate, evidence.relations)
    if untrained:  # (held where no gradient reaches: a buffer, requires_grad off)
        note = (f"gradients from each model's own backward of its first plain call: "
                f"{len(untrained)} weight(s) the reference trains held untrained")
        return PlainVerdict(None, f"{untrained[0].reference} is held untrained",
                            BackwardResult(False, kind, reference.loss, candidate.loss, [],
                                           untrained, _divergence(untrained[0],
                                                                  reference_model),
                                           max(r.sgd_max_abs_err or 0.0 for r in untrained),
                                           [note]))
    if reference.frozen or candidate.frozen:
        return PlainVerdict(None, "frozen weights: " + ", ".join(
            (reference.frozen + candidate.frozen)[:3]))
    pairs, unpaired = _weight_pairs(reference, candidate, evidence)
    rows, sgd = _parameter_rows(reference, candidate, pairs, tolerance, allow_nonfinite, noise)
    over = [r for r in rows if r.status == STATUS_FAIL]
    if over:  # (a pair proven over budget proves the FAIL, whatever the others)
        note = (f"gradients from each model's own backward of its first plain call: "
                f"{len(over)} of {len(rows)} weights paired by proof over budget"
                + (f"; not all paired ({unpaired})" if unpaired else ""))
        # the weight nearest the loss, unless the handed gradients part in another layer
        # (the error arrived there from a later layer's backward); in its own layer the
        # weight is the finer name (a value cut from a fused projection: its rows)
        divergence = _divergence(over[-1], reference_model)
        parted = _parted(evidence, tolerance, attention_mask, allow_nonfinite,
                         reference_model, over[-1])
        if parted is not None and parted.layer != divergence.layer:
            divergence = parted
        return PlainVerdict(None, f"{over[0].reference}'s gradient is over its budget",
                            BackwardResult(False, kind, reference.loss, candidate.loss, [],
                                           rows, divergence, sgd, [note]))
    if unpaired:
        return PlainVerdict(None, unpaired)
    compared, why = _module_outputs(evidence, tolerance, attention_mask, allow_nonfinite)
    if why:
        return PlainVerdict(None, why)
    note = (f"gradients from each model's own backward of its first plain call: {len(rows)} "
            f"weights and {compared} module outputs within budget; no node recorded (for "
            "node gradients pass nodes=True; introspect diff: --out or --nodes)")
    return PlainVerdict(BackwardResult(True, kind, reference.loss, candidate.loss, [], rows,
                                       None, sgd, [note]))


@dataclasses.dataclass(frozen=True)
class _WeightPair:
    reference: str
    candidate: str
    relation: str  # "same", "transposed", "reshaped", "transposed reshaped", "fused ..."
    rows: Region | None = None  # "fused": its rows of the candidate's (transposed)
    start: int = -1  # "slice of": its first element in the candidate's, flat (``slices``)


def _weight_pairs(reference: PlainGradients, candidate: PlainGradients,
                  evidence: ModuleEvidence) -> tuple[list[_WeightPair], str]:
    """Each candidate weight proven to hold one reference weight, with it, in the
    reference's order; and why not every weight is so paired ("": every one is)."""
    modules = {r.candidate_module: r.reference_module for r in evidence.rows
               if r.call == AUTOGRAD and r.status == STATUS_OK}
    found: dict[str, _WeightPair] = {}
    unpaired: list[str] = []
    holds_none: list[str] = []  # candidate weights holding no one reference weight whole
    refolded = _refolded(reference, candidate, evidence)
    for name, weight in candidate.parameters.items():
        held = sorted(evidence.relations.get(name, ()))
        held = [r for r in held if r.rpartition(".")[0] not in refolded]
        blocks = _fused_blocks({r: reference.parameters[r] for r in held}, weight) \
            if len(held) > 1 else None
        if blocks is not None:  # q, k and v side by side in one weight: each its rows
            for pair in blocks:
                if pair.reference in found:
                    unpaired.append(f"{pair.reference} is held twice")
                else:
                    found[pair.reference] = dataclasses.replace(pair, candidate=name)
            continue
        if len(held) > 1:  # several alike: the one its module's pair owns
            owner = modules.get(name.rpartition(".")[0])
            held = [r for r in held if owner is not None
                    and r.rpartition(".")[0] == owner]
        if len(held) != 1:
            holds_none.append(name)
            continue
        relation = _relation(reference.parameters[held[0]], weight)
        if relation is None:
            unpaired.append(f"the candidate's {name} holds {held[0]} otherwise than whole")
        elif held[0] in found:  # held twice (untied copies): neither is proven its pair
            unpaired.append(f"{held[0]} is held by {found.pop(held[0]).candidate} and {name}")
        else:
            found[held[0]] = _WeightPair(held[0], name, relation)
    wanted = {name for name, grad in reference.parameter_grads.items()
              if name not in found and grad is not None and bool((grad != 0).any())
              and name.rpartition(".")[0] not in refolded}
    held_whole = set().union(*evidence.relations.values()) if evidence.relations else set()
    covered: dict[str, int] = {}
    if wanted and holds_none:  # a flat Parameter of weights: each its slice (``slices``)
        sliced = find_slices(reference.parameters,
                             {n: candidate.parameters[n] for n in holds_none},
                             wanted - held_whole)
        for name, piece in sliced.items():
            found[name] = _WeightPair(name, piece.candidate, "slice of", start=piece.start)
            covered[piece.candidate] = covered.get(piece.candidate, 0) \
                + reference.parameters[name].numel()
        wanted -= set(sliced)
    unpaired = [f"the candidate's {name} holds no one reference weight alone"
                for name in holds_none
                if covered.get(name) != candidate.parameters[name].numel()] + unpaired
    unpaired += [f"the reference's {name} has a gradient and no candidate weight is proven "
                 "to hold it" for name in reference.parameter_grads if name in wanted]
    return [found[name] for name in reference.parameters if name in found], \
        unpaired[0] if unpaired else ""


def _refolded(reference: PlainGradients, candidate: PlainGradients,
              evidence: ModuleEvidence) -> set[str]:
    """The reference's norms whose gain the candidate folded into the Linears reading them
    (``ops.align.weights.folds_between``): another parametrization, so the norm's gradient
    is spread over the candidate's folded weights, and its copy of the gain (kept for the
    residual) holds only part of it. Neither is compared."""
    unrelated = {name: weight for name, weight in candidate.parameters.items()
                 if not evidence.relations.get(name)}
    if not unrelated:
        return set()
    return {fold.gain.rpartition(".")[0]
            for fold in folds_between(reference.parameters, unrelated)}


def _relation(ref: torch.Tensor, cand: torch.Tensor) -> str | None:
    if ref.dtype != cand.dtype:
        return None
    if ref.shape == cand.shape and torch.equal(ref, cand):
        return "same"
    if ref.ndim == 2 and cand.ndim == 2 and ref.shape == cand.t().shape \
            and torch.equal(ref, cand.t()):
        return "transposed"
    if ref.numel() == cand.numel() and ref.shape != cand.shape:  # (nh, hd, H) for einsum
        if torch.equal(cand.reshape(ref.shape), ref):
            return "reshaped"
        if ref.ndim == 2 and torch.equal(cand.reshape(ref.shape[::-1]), ref.t()):
            return "transposed reshaped"
    return None


def _fused_blocks(held: Mapping[str, torch.Tensor],
                  weight: torch.Tensor) -> list[_WeightPair] | None:
    """Where ``weight`` is the ``held`` weights side by side, row blocks of it (or of its
    transpose: a Conv1D's), each equal to one of them and together all of it: their pairs
    (the candidate's name left blank); else None (alike weights found at one block, an
    overlap or a gap: no proof of which rows hold which)."""
    for transposed in (False, True) if weight.ndim == 2 else (False,):
        rows = weight.t() if transposed else weight
        blocks = []
        for name, ref in held.items():
            size = ref.shape[0] if ref.ndim else 0
            if ref.dtype != rows.dtype or ref.shape[1:] != rows.shape[1:] or not size:
                break
            start = next((at for at in range(0, rows.shape[0] - size + 1, size)
                          if torch.equal(rows[at:at + size], ref)), None)
            if start is None:
                break
            blocks.append((start, start + size, name))
        else:
            blocks.sort()
            tiled = all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
            if blocks and tiled and blocks[0][0] == 0 and blocks[-1][1] == rows.shape[0]:
                kind = "fused transposed" if transposed else "fused"
                return [_WeightPair(name, "", kind, Region(0, start, stop))
                        for start, stop, name in blocks]
    return None


def _parameter_rows(reference: PlainGradients, candidate: PlainGradients,
                    pairs: Sequence[_WeightPair], tolerance: Tolerance,
                    allow_nonfinite: bool, noise: Mapping[str, float] | None = None,
                    ) -> tuple[list[ParameterGradient], float]:
    """The rows ``parity`` makes for these weights, and the SGD step."""
    grads = {p.reference: _or_zeros(reference.parameter_grads.get(p.reference),
                                     reference.parameters[p.reference]) for p in pairs}
    largest = max((magnitude_of(g) for g in grads.values() if g.numel()), default=0.0)
    rows, sgd = [], 0.0
    for pair in pairs:
        g_ref = grads[pair.reference]
        g_cand = _or_zeros(candidate.parameter_grads.get(pair.candidate),
                           candidate.parameters[pair.candidate])
        # laid out as the reference's weight, as the recorded path lays it out
        laid = Slice(pair.reference, pair.candidate, pair.start).of(g_cand, g_ref.shape) \
            if pair.relation == "slice of" else _to_reference(g_cand, g_cand, WeightRelation(
                pair.candidate, pair.reference, pair.relation, pair.rows, 0.0), g_ref)
        g_cand = g_cand if laid is None else laid  # (None for a slice: none is paired here)
        err, rel, over, scale = _measured(g_cand, g_ref, tolerance, largest, allow_nonfinite,
                                          noise=(noise or {}).get(f"param:{pair.reference}"))
        weight = reference.parameters[pair.reference]
        step = 0.0
        if err:  # (the weights are equal: the step differs by the gradients alone)
            step = _sgd_step_error(weight, g_ref, weight, g_cand)
            sgd = max(sgd, step)
        hint = "; ".join(gradient_hints(g_cand, g_ref, None, cut=False,
                                        where=f"{pair.reference}'s gradient",
                                        weight=True)) if over else ""
        rows.append(ParameterGradient(pair.reference, pair.candidate, pair.relation,
                                      str(tuple(g_ref.shape)), err, rel, scale, step,
                                      STATUS_FAIL if over else STATUS_OK, hint))
    return rows, sgd


def _divergence(row: ParameterGradient, reference: torch.nn.Module) -> BackwardDivergence:
    """A failing weight as the recorded path names one: the reference's module and layer,
    the candidate's module beside them."""
    module = row.reference.rpartition(".")[0]
    budget = f"atol x the gradient's magnitude {row.reference_max_abs:.3g}"
    return BackwardDivergence("", row.candidate, module,
                              ReferenceLayers.of(reference).of_module(module), "parameter",
                              row.max_abs_err or 0.0, budget,
                              tuple(h for h in row.hint.split("; ") if h),
                              parameter=row.reference,
                              candidate_module=row.candidate.rpartition(".")[0])


def _parted(evidence: ModuleEvidence, tolerance: Tolerance,
            attention_mask: torch.Tensor | None, allow_nonfinite: bool,
            reference: torch.nn.Module, row: ParameterGradient) -> BackwardDivergence | None:
    """A weight FAIL named at the module whose backward parts (``parting``): what the
    modules' outputs were handed, held to the budgets a PASS holds them to; where none is
    over budget, what took the output of ``row``'s module (the failing weight nearest the
    loss; its call found in ``evidence.candidate_calls``)."""
    largest = _largest_handed(evidence)

    def measure(mine: Leaf, theirs: Leaf) -> tuple[float, bool]:
        assert mine.grad is not None and theirs.grad is not None
        if mine.grad.shape != theirs.grad.shape:
            return math.inf, True
        return _handed_over(mine.grad, theirs.grad, tolerance, largest, allow_nonfinite,
                            attention_mask)

    budget = f"the budget a PASS holds the gradient handed to a module's output to ({FLOOR:g} " \
        "of the largest at least)"
    owner = row.candidate.split(" + ")[0].rpartition(".")[0]
    parting = where_gradients_part(evidence, measure,
                                   _returned_by(owner, evidence.candidate_calls))
    if parting is None:
        return None
    # (the reference module holding its weights: a layer, not the norm returning its value)
    call, module = parting.pair.call, parting.pair.region or parting.pair.reference_module
    if parting.producer:
        error = parting.error
        hint = handed_hint(call.name, parting.producer)
    else:  # no module output's gradient over budget: the failing weight's module's output
        error, budget = row.max_abs_err or 0.0, _divergence(row, reference).budget
        hint = weight_hint(row.reference, call.name, owner)
    return BackwardDivergence(module, call.name, module,
                              ReferenceLayers.of(reference).of_module(module),
                              type(call.module).__name__, error, budget,
                              (hint,), candidate_module=call.name)


def _returned_by(module: str, calls: Sequence[ModuleCall]) -> Leaf | None:
    """What the candidate's ``module`` returned in its first call with autograd on (None:
    not called so, or it returned no tensor)."""
    call = next((c for c in calls if c.name == module and c.mode == AUTOGRAD and c.outputs),
                None)
    return call.outputs[0] if call is not None else None


def gradients_moved(recorded: PlainGradients | object, own: PlainGradients,
                    tolerance: Tolerance) -> str:
    """The first weight whose gradient in ``recorded`` (a recorded backward of the same
    model, its ``parameter_grads``) is over budget from its own backward's ("": none)."""
    theirs: Mapping[str, torch.Tensor | None] = getattr(recorded, "parameter_grads", {})
    grads = {n: g for n, g in own.parameter_grads.items() if g is not None}
    largest = max((magnitude_of(g) for g in grads.values() if g.numel()), default=0.0)
    for name, g_own in grads.items():
        g_rec = _or_zeros(theirs.get(name), g_own)
        if g_rec.shape != g_own.shape or _measured(g_rec, g_own, tolerance, largest,
                                                   allow_nonfinite=True)[2]:
            return name
    return ""


def _or_zeros(grad: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(weight) if grad is None else grad


def _measured(g_cand: torch.Tensor, g_ref: torch.Tensor, tolerance: Tolerance,
              largest: float, allow_nonfinite: bool, pad: torch.Tensor | None = None,
              noise: float | None = None) -> tuple[float, float, bool, float]:
    """(max abs, max rel, over budget, the reference's magnitude) of one gradient against
    the reference's, with the budget the recorded path gives it (``measure._budget``: the
    forward's relative to its magnitude, at least ``FLOOR`` of ``largest``; with its
    ``noise``, at least ``noise_factor`` times that)."""
    scale = magnitude_of(g_ref)
    budget = _budget(tolerance, g_ref.dtype, max(scale, FLOOR * largest), noise)
    err, rel, over, _ = _errors(g_cand, g_ref, budget, pad, allow_nonfinite,
                                ref_magnitude=scale)
    return err, rel, over, scale


def _largest_handed(evidence: ModuleEvidence) -> float:
    """The largest gradient the reference's values that module pairs stand on were handed
    in its own backward (each handed gradient's budget is at least ``FLOOR`` of it)."""
    return max((magnitude_of(pair.output.boundary.returned_leaf.grad)
                for pair in evidence.pairs if pair.call.mode == AUTOGRAD
                and pair.output.boundary.returned_leaf is not None
                and pair.output.boundary.returned_leaf.grad is not None), default=0.0)


def _handed_over(g_cand: torch.Tensor, g_ref: torch.Tensor, tolerance: Tolerance,
                 largest: float, allow_nonfinite: bool,
                 attention_mask: torch.Tensor | None) -> tuple[float, bool]:
    """(max abs error, over budget) of a gradient handed to a module's output, against the
    reference's, padded positions apart."""
    pad = padded_positions(attention_mask, g_ref.shape)
    error, _, over, _ = _measured(g_cand, g_ref, tolerance, largest, allow_nonfinite, pad)
    return error, over


def _module_outputs(evidence: ModuleEvidence, tolerance: Tolerance,
                    attention_mask: torch.Tensor | None,
                    allow_nonfinite: bool) -> tuple[int, str]:
    """How many module outputs' gradients were compared, all within budget; else a
    reason."""
    compared: list[tuple[Leaf, Leaf, str]] = []
    for pair in evidence.pairs:
        call = pair.call
        if call.mode != AUTOGRAD:
            continue
        mine, theirs = call.outputs[0], pair.output.boundary.returned_leaf
        if theirs is None:
            continue
        compared.append((mine, theirs, call.name or "the model"))
    edited = [name for mine, theirs, name in compared
              if mine.grad_edited() or theirs.grad_edited()]
    if edited:
        return 0, f"a backward edited the gradient handed to {edited[0]} in place"
    largest = _largest_handed(evidence)
    count = 0
    for mine, theirs, name in compared:
        given = [g for g in (mine.grad, theirs.grad) if g is not None]
        if not given:
            continue  # no gradient reached either
        if mine.grad is None and not mine.tracked:
            # made without autograd (a reentrant checkpoint's region runs under no_grad,
            # and again in the backward): no gradient is handed to this value; what it
            # would be shows in the weights' gradients
            continue
        g_cand, g_ref = _or_zeros(mine.grad, given[0]), _or_zeros(theirs.grad, given[0])
        if g_cand.shape != g_ref.shape:
            return 0, f"the gradient of {name}'s output has another shape"
        if _handed_over(g_cand, g_ref, tolerance, largest, allow_nonfinite, attention_mask)[1]:
            return 0, f"the gradient of {name}'s output is over its budget"
        count += 1
    return count, ""


__all__ = ["PlainVerdict", "gradients_moved", "judge_plain_gradients"]
