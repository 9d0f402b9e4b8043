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

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from introspect.diff.backward.again import reference_again, run_again
from introspect.diff.backward.hints import gradient_hints, untied_hint
from introspect.diff.backward.local import _LocalBackward
from introspect.diff.backward.losses import default_loss, loss_kind
from introspect.diff.backward.measure import (
    FLOOR,
    _budget,
    _Comparer,
    _errors,
    _Forming,
    magnitude_of,
)
from introspect.diff.backward.plain import PlainGradients
from introspect.diff.backward.record import (
    GradientRecording,
    GradientRun,
    LossFn,
    for_side,
    record_backward,
)
from introspect.diff.backward.results import (
    STATUS_DRIFT,
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_OK,
    BackwardDivergence,
    BackwardResult,
    GradientDiff,
    ParameterGradient,
)
from introspect.diff.backward.slices import Slice, find_slices
from introspect.diff.copies import cast_copy
from introspect.diff.ops.compare.layouts import inverse_order
from introspect.diff.records import WeightRelation
from introspect.diff.tolerance import Tolerance
from introspect.errors import InputError

SGD_LR = 1e-3


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
                  loss_inputs: Mapping[str, torch.Tensor] | None = None,
                  noise: Mapping[str, float] | None = None) -> BackwardResult:
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
        noise: each gradient's rounding noise, measured already (``gradient_noise``):
            its budget is at least ``tolerance.noise_factor`` times it, as with
            ``noise_budget``, which measures it here.

    Raises:
        InputError: the reference's loss is NaN or Inf, or every gradient of the
            reference is zero (there is nothing to compare), or the loss fails.
    """
    inputs_for_loss = loss_inputs if loss_inputs is not None else {**cand_inputs, **ref_inputs}
    kind, loss_fn = backward_loss(reference, ref_inputs, loss, inputs_for_loss)
    ref = reference_gradients if reference_gradients is not None else \
        record_backward(reference, ref_inputs, for_side(loss_fn, "reference"))
    if noise is None:
        noise = gradient_noise(reference, candidate, ref_inputs, loss_fn, inputs_for_loss,
                               ref) if noise_budget else {}
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
        # again (``again.run_again``).
        forming = _Forming(candidate_run.recorder)
        comparer = _Comparer(ref, forming, alignment, records, cand_records, tolerance, noise,
                             attention_mask, allow_nonfinite, again)
        consumer = comparer.stream()
        candidate_run.let_values_go(comparer.values_needed)
        forming.shells = candidate_run.shells or {}
        cand = candidate_run.backward(for_side(loss_fn, "candidate"), detached_ok=True,
                                      consumer=consumer,
                                      keep_graph=False)
        comparer.cand = cand
        first_cand = cand
        comparer.again_for_candidate(
            lambda: run_again(candidate, cand_inputs, first_cand))
    else:
        cand = record_backward(candidate, cand_inputs, for_side(loss_fn, "candidate"),
                               detached_ok=True)
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
    divergence = _first_divergence(rows, params, records, tolerance, cand_records)
    passed = divergence is None and not any(r.status == STATUS_FAIL for r in rows) \
        and not any(r.status in (STATUS_FAIL, STATUS_DRIFT) for r in params) \
        and (allow_nonfinite or math.isfinite(cand.loss)) and not cand.detached \
        and not unexplained
    if not math.isclose(ref.loss, cand.loss, rel_tol=1e-4, abs_tol=1e-6):
        notes.append(f"the two losses differ: reference {ref.loss:.6g}, candidate "
                     f"{cand.loss:.6g}")
    return BackwardResult(passed, kind, ref.loss, cand.loss, rows, params, divergence, sgd,
                          notes, by_budget=math.isfinite(cand.loss) and not cand.detached
                          and not unexplained)


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


def _loss_notes(kind: str, ref: GradientRecording | PlainGradients,
                cand: GradientRecording | PlainGradients, allow_nonfinite: bool) -> list[str]:
    """Refuse a loss that leaves nothing to compare; say what fails on the candidate's side.

    A NaN or Inf loss makes every gradient NaN or Inf (or zero), and all-zero gradients
    (a loss times 0) agree with anything: either would let any port pass.
    """
    if not math.isfinite(ref.loss) and not allow_nonfinite:
        raise InputError(f"the reference's {kind} loss is {ref.loss}: its gradients compare "
                         "nothing; check the loss and the inputs (or pass --allow-nonfinite "
                         "to compare them anyway)")
    if math.isfinite(ref.loss) and not _any_gradient(ref):
        raise InputError(f"every gradient of the reference's {kind} loss is zero, so a "
                         "backward diff compares nothing; give a loss that depends on the "
                         "outputs (not one times 0)")
    notes = []
    if not math.isfinite(cand.loss):
        notes.append(f"the candidate's loss is {cand.loss} (the reference's: {ref.loss:.6g})"
                     + ("; allowed by --allow-nonfinite" if allow_nonfinite
                        else ": the backward diff fails"))
    if cand.detached and not cand.parameter_grads:
        notes.append("the candidate holds no parameters (its weights are buffers, which "
                     "no optimizer trains): its loss reaches no weight, the backward diff "
                     "fails")
    elif cand.detached:
        notes.append("the candidate's loss does not depend on its parameters (its forward "
                     "ran under no_grad, or detached its outputs): no gradient reaches it, "
                     "the backward diff fails")
    return notes


def _any_gradient(recording: GradientRecording | PlainGradients) -> bool:
    grads = [*recording.grads.values(),
             *(g for g in recording.parameter_grads.values() if g is not None)]
    return any(bool((g != 0).any()) for g in grads if g.numel())


def gradient_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                   ref_inputs: Mapping[str, torch.Tensor], loss_fn: LossFn,
                   inputs_for_loss: Mapping[str, torch.Tensor],
                   ref: GradientRecording | PlainGradients) -> dict[str, float]:
    """Per node and per parameter: |gradient in the candidate's dtype - in float64|."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()),
                 torch.float32)
    exact_model = cast_copy(reference, torch.float64, what="backward noise").eval()
    exact = record_backward(exact_model, {name: t.double() if t.is_floating_point() else t
                                          for name, t in ref_inputs.items()}, loss_fn)
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
    refolded = _refolded(alignment.relations, ref_alias)
    for relation in alignment.relations:
        r_name, c_name = ref_alias.get(relation.reference), cand_alias.get(relation.candidate)
        if r_name is None or c_name is None or "folded" in relation.kind \
                or r_name.rpartition(".")[0] in refolded:
            continue
        found = by_ref.setdefault(r_name, [])
        if all(c != c_name for c, _ in found):
            found.append((c_name, relation))
    rows, sgd = [], 0.0
    largest = max((magnitude_of(g) for g in ref.parameter_grads.values()
                   if g is not None and g.numel()), default=0.0)
    sliced = _sliced(ref, cand, by_ref, refolded)
    for r_name in ref.parameters:
        related = by_ref.get(r_name)
        g_ref = ref.parameter_grads.get(r_name)
        weight = ref.parameters[r_name]
        if g_ref is None:
            g_ref = torch.zeros_like(weight)
        scale = magnitude_of(g_ref)
        budget = _budget(tolerance, g_ref.dtype, max(scale, FLOOR * largest),
                         noise.get(f"param:{r_name}"))
        mapped: list[tuple[str, WeightRelation, torch.Tensor]] = []
        for c, relation in related or ():
            g = _to_reference(cand.parameter_grads.get(c), cand.parameters[c], relation, weight)
            if g is not None:
                mapped.append((c, relation, g))
        if r_name in sliced:  # a slice of a flat Parameter (``slices``): its part of the grad
            piece = sliced[r_name]
            g = cand.parameter_grads.get(piece.candidate)
            mapped.append((piece.candidate, WeightRelation(
                piece.candidate, r_name, "slice of", None, 0.0),
                piece.of(torch.zeros_like(cand.parameters[piece.candidate]) if g is None
                         else g, weight.shape)))
        assembled = None
        if not mapped:  # held in row blocks by several (one Linear per head)
            assembled = _assembled(related or [], weight, cand)
            if assembled is None:
                continue
            mapped.append((assembled[0], WeightRelation(assembled[0], r_name, ASSEMBLED,
                                                        None, 0.0), assembled[1]))
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
        if over and assembled is not None:  # the part holding the worst row, first
            worst = int((g_c.double() - g_ref.double()).abs().reshape(
                g_ref.shape[0], -1).amax(1).nan_to_num(math.inf).argmax())
            part = next(c for c, start, stop in assembled[4] if start <= worst < stop)
            names = f"{part} (of {len(assembled[4])} holding its rows)"
        if over:
            cut = assembled[3] if assembled is not None else \
                cand.parameter_grads.get(c_name) is None
            hint = "; ".join(gradient_hints(g_c, g_ref, None, cut=cut,
                                            where=f"{r_name}'s gradient", weight=True))
            copies = [m for m in mapped if m[1].region is None]
            if len(copies) > 1:
                total = torch.stack([m[2].double() for m in copies]).sum(dim=0)
                t_err, _, t_over, _ = _errors(total, g_ref, budget,
                                              allow_nonfinite=allow_nonfinite)
                if not t_over:
                    hint = untied_hint(r_name, [m[0] for m in copies])
                    names = " + ".join(m[0] for m in copies)
        if assembled is not None:
            w_cand = assembled[2] if err else None
            step = 0.0 if not err and torch.equal(assembled[2], weight) else None
        else:
            w_cand = (sliced[r_name].of(cand.parameters[c_name], weight.shape)
                      if relation.kind == "slice of" else
                      _to_reference(cand.parameters[c_name], cand.parameters[c_name],
                                    relation, weight)) if err else None
            step = 0.0 if not err and cand.parameters[c_name].shape == weight.shape \
                and torch.equal(cand.parameters[c_name], weight) else None
        if w_cand is not None:
            step = _sgd_step_error(weight, g_ref, w_cand, g_c)
            sgd = max(sgd, step)
        rows.append(ParameterGradient(r_name, names, relation.kind, str(tuple(g_ref.shape)),
                                      err, rel, scale, step, STATUS_FAIL if over else STATUS_OK,
                                      hint))
    return rows, sgd


ASSEMBLED = "rows of several"  # a reference weight held in row blocks by several weights


def _assembled(related: Sequence[tuple[str, WeightRelation]], weight: torch.Tensor,
               cand: GradientRecording,
               ) -> tuple[str, torch.Tensor, torch.Tensor, bool,
                          list[tuple[str, int, int]]] | None:
    """A reference weight held in blocks of its rows by several candidate weights (a
    Linear per head, each a slice of the query's rows): (their names, their gradients
    and their values put together in the reference's layout, whether some part had no
    gradient, each part's rows), where the blocks cover every row once; None otherwise. Each part's
    gradient was left out, and a head's query gradient scaled by 1.01 PASSED."""
    parts = [(c, r) for c, r in related
             if r.kind in ("slice", "transposed slice") and r.region is not None]
    if len(parts) != len(related) or weight.ndim < 1 or weight.shape[0] < 2:
        return None
    grads = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
    values = torch.zeros_like(grads)
    covered = torch.zeros(weight.shape[0], dtype=torch.int32)
    spans: list[tuple[str, int, int]] = []
    cut = False
    for c, relation in parts:
        value = cand.parameters[c].detach()
        grad = cand.parameter_grads.get(c)
        cut = cut or grad is None
        grad = torch.zeros_like(value) if grad is None else grad
        if relation.kind.startswith("transposed"):
            if value.ndim != 2:
                return None
            value, grad = value.t(), grad.t()
        region = relation.region
        assert region is not None  # (``parts`` holds slices with a region only)
        start, stop = region.start, region.stop
        if tuple(value.shape) != (stop - start, *weight.shape[1:]):
            return None
        grads[start:stop] = grad.to(grads)
        values[start:stop] = value.to(values)
        covered[start:stop] += 1
        spans.append((c, start, stop))
    used = {c for c, _ in parts}
    for c, start, value, grad in _blocks_of(weight, cand, used, covered):
        # a part the recording saw read through an expression (``W + 0.01 * (W -
        # W.detach())``): held by its values, found among the candidate's parameters
        cut = cut or grad is None
        stop = start + value.shape[0]
        grads[start:stop] = (torch.zeros_like(value) if grad is None else grad).to(grads)
        values[start:stop] = value.to(values)
        covered[start:stop] += 1
        spans.append((c, start, stop))
        parts.append((c, WeightRelation(c, "", "slice", None, 0.0)))
    if len(parts) < 2 or not bool((covered == 1).all()):
        return None
    names = f"{parts[0][0]} and {len(parts) - 1} more (its rows)"
    return names, grads, values, cut, spans


def _blocks_of(weight: torch.Tensor, cand: GradientRecording, used: set[str],
               covered: torch.Tensor) -> list[tuple[str, int, torch.Tensor, Any]]:
    """The candidate's parameters (not ``used``) holding, bit for bit, a block of the
    rows of ``weight`` that ``covered`` has no part for: (name, first row, the value in
    the reference's layout, its gradient in that layout or None)."""
    rows = weight.reshape(weight.shape[0], -1)
    if torch.unique(rows, dim=0).shape[0] != rows.shape[0]:
        return []  # rows alike (random init's zero biases): their places are not proven
    found = []
    for c, param in cand.parameters.items():
        if c in used or param.ndim != weight.ndim or param.dtype != weight.dtype:
            continue
        grad = cand.parameter_grads.get(c)
        for turned in (False, True) if param.ndim == 2 else (False,):
            value = param.detach().t() if turned else param.detach()
            if value.shape[1:] != weight.shape[1:] or not 0 < value.shape[0] < weight.shape[0]:
                continue
            first = (weight == value[0]).reshape(weight.shape[0], -1).all(1)
            for start in first.nonzero().flatten().tolist():
                stop = start + value.shape[0]
                if stop <= weight.shape[0] and not bool(covered[start:stop].any()) \
                        and torch.equal(weight[start:stop], value):
                    found.append((c, start, value,
                                  None if grad is None else (grad.t() if turned else grad)))
                    break
    return found


def _sliced(ref: GradientRecording, cand: GradientRecording,
            by_ref: Mapping[str, list[tuple[str, WeightRelation]]],
            refolded: set[str]) -> dict[str, Slice]:
    """The reference weights no candidate weight holds whole, each found as a slice of a
    candidate Parameter that holds none whole (a flat Parameter of weights: ``slices``)."""
    wanted = {r for r in ref.parameters
              if r not in by_ref and r.rpartition(".")[0] not in refolded}
    holding = {c for found in by_ref.values() for c, _ in found}
    holders = {c: p for c, p in cand.parameters.items() if c not in holding}
    return find_slices(ref.parameters, holders, wanted) if wanted and holders else {}


def _refolded(relations: Sequence[WeightRelation], ref_alias: Mapping[str, str]) -> set[str]:
    """The reference's modules whose gain a candidate folded into the Linears reading them
    (``W' = W diag(g)``): the candidate holds another parametrization there, so neither
    those Linears' gradients nor the norm's are the reference's (the norm's gradient is
    spread over the candidate's folded weights), and none is compared."""
    return {ref_alias.get(r.scaled_by, r.scaled_by).rpartition(".")[0]
            for r in relations if "folded" in r.kind and r.scaled_by}


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
    if kind == "transposed reshaped" and ref_weight.ndim == 2 \
            and g.numel() == ref_weight.numel():  # (nh, hd, H) holding W.t()
        return g.reshape(ref_weight.shape[::-1]).t()
    if "transposed" in kind and g.ndim == 2:
        g = g.t()
    region = relation.region
    if kind.startswith("fused") and region is not None:
        g = g.narrow(0, region.start, region.stop - region.start) if g.ndim >= 1 else g
    if kind == "permuted" and relation.order is not None:
        g = g[inverse_order(torch.tensor(relation.order))]
    if "slice" in kind:
        return None  # a part of the reference's weight: compared through the fused rows
    if g.shape != ref_weight.shape:
        return g.reshape(ref_weight.shape) if g.numel() == ref_weight.numel() else None
    return g


def _layer_of(module: str, records: Mapping[str, Any]) -> str:
    """The reference's layer that holds ``module`` (a weight's owner): the layer of the
    nodes it computes, or of the nodes of its nearest enclosing module."""
    layers: dict[str, str] = {}
    for record in records.values():
        owner = getattr(record, "module", "")
        if getattr(record, "layer", "") and owner:
            layers.setdefault(owner, record.layer)
    path = module
    while path:
        inside = [layer for owner, layer in layers.items()
                  if owner == path or owner.startswith(path + ".")]
        if inside:
            return inside[0]
        path = path.rpartition(".")[0]
    return ""


def _first_divergence(rows: Sequence[GradientDiff], params: Sequence[ParameterGradient],
                      records: Mapping[str, Any], tolerance: Tolerance,
                      cand_records: Mapping[str, Any] | None = None,
                      ) -> BackwardDivergence | None:
    """Walking from the outputs toward the inputs: the first failing node, else weight.
    ``layer`` and ``module`` are the reference's, ``candidate_module`` the candidate's."""
    divergence = _first_failing(rows, params, records, tolerance)
    if divergence is None:
        return None
    if divergence.parameter:
        own = divergence.candidate_node.rpartition(".")[0]
    else:
        record = (cand_records or {}).get(divergence.candidate_node)
        own = getattr(record, "module", "") or ""
    return dataclasses.replace(divergence, candidate_module=own)


def _first_failing(rows: Sequence[GradientDiff], params: Sequence[ParameterGradient],
                   records: Mapping[str, Any], tolerance: Tolerance,
                   ) -> BackwardDivergence | None:
    float32 = tolerance.node_budget("float32")
    failing = [r for r in rows if r.status == STATUS_FAIL]
    if failing:
        r = max(failing, key=lambda row: row.reference_index)
        return BackwardDivergence(r.reference_node, r.candidate_node, r.module, r.layer, r.op,
                                  r.local_max_abs_err or 0.0,
                                  f"atol {float32.atol:.3g} x the gradient's "
                                  f"magnitude + rtol {float32.rtol:.3g} "
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
        return BackwardDivergence("", p.candidate, module, _layer_of(module, records),
                                  "parameter", p.max_abs_err or 0.0,
                                  f"atol {float32.atol:.3g} x the gradient's "
                                  "magnitude", tuple(h for h in p.hint.split("; ") if h),
                                  parameter=p.reference)
    return None


__all__ = ["FLOOR", "SGD_LR", "STATUS_DRIFT", "STATUS_FAIL", "STATUS_NOT_COMPARED",
           "STATUS_OK", "BackwardDivergence", "BackwardResult", "GradientDiff",
           "ParameterGradient", "backward_diff", "backward_loss", "gradient_noise",
           "magnitude_of"]
