"""``introspect.diff``: node-by-node parity between two implementations of one model.

The flow (shared/DESIGN.md): record what both models run (``eager``), align their graphs
(``align``), replay them side by side measuring every pair (``compare``), fail what
rounding cannot explain (``drift``), and turn the measurements into tables,
the first divergence and its likely cause (``hints``). Reports are written by
``introspect.report``; this module only returns values.

Example::

    >>> import introspect
    >>> loaded = introspect.load_model("bert-tiny")
    >>> port = introspect.scratch.BertModel.from_hf(loaded.model)
    >>> result = introspect.diff(loaded.model, port, introspect.tokenize(loaded.tokenizer))
    >>> result.passed, result.first_divergence
    (True, None)
    >>> result.layers[["layer", "max_abs_err", "passed"]].head(3)
            layer  max_abs_err  passed
    0      inputs          0.0    True
    1  embeddings          0.0    True
    2        mask          0.0    True
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from introspect.diff.align import Alignment, align_graphs
from introspect.diff.compare import Padding, run_side_by_side
from introspect.diff.divergence import confirm_failures, first_divergence
from introspect.diff.drift import find_drift, mark_drift
from introspect.diff.eager import Recording, outputs_not_replayed, record_forward
from introspect.diff.exercised import unexercised_notes
from introspect.diff.records import STATUS_FAIL, NodeDiff
from introspect.diff.result import DiffResult
from introspect.diff.tables import layer_rows, node_rows
from introspect.diff.tolerance import DEFAULTS, Budget, Tolerance, compare_dtype
from introspect.errors import InputError
from introspect.graph import MASK_NOTE, IntrospectGraph
from introspect.models.load import TokenizedInputs
from introspect.trace.shapes import node_records, refresh_records
from introspect.trace.tracer import CACHE_OFF_NOTE, cache_off, holds_trace_lock

# ---------------------------------------------------------------------------------------
# Recording for a diff


def _accepted_inputs(model: torch.nn.Module,
                     tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs ``model.forward`` takes by name (all of them when it takes ``**kwargs``)."""
    parameters = inspect.signature(model.forward).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(tensors)
    return {name: t for name, t in tensors.items() if name in parameters}


def record_for_diff(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                    title: str, keywords: Mapping[str, Any] | None = None,
                    ) -> tuple[IntrospectGraph, dict[str, torch.Tensor], Recording]:
    """Run ``model`` once and record what it ran (``introspect.diff.eager``).

    The diff works on what the model really computes on these inputs: its hooks,
    private state, globals and Python branches included, and no graph is cached or
    replayed from another layer.
    """
    accepted = _accepted_inputs(model, tensors)
    if not accepted:
        raise InputError(f"{type(model).__name__}.forward takes none of the inputs "
                         f"{', '.join(tensors)}")
    cache_note = keywords is None and bool(cache_off(model, accepted))
    if keywords is None:  # a decoder's cache on by default: one forward without it
        keywords = cache_off(model, accepted)
    recording = record_forward(model, accepted, title, keywords)
    notes = [*recording.notes, *([CACHE_OFF_NOTE] if cache_note else [])]
    graph = IntrospectGraph(recording.gm, node_records(recording.gm), recording.input_names,
                            recording.output_names, notes=notes, title=title)
    return graph, accepted, recording


# ---------------------------------------------------------------------------------------
# The diff


@holds_trace_lock  # thread safety: fx patches process-wide state (tracer.py)
def diff(reference: torch.nn.Module, candidate: torch.nn.Module,
         inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
         atol: float | None = None, rtol: float | None = None, noise_budget: bool = False,
         noise_factor: float = 4.0, name_map: Mapping[str, str] | None = None,
         reference_label: str = "", candidate_label: str = "",
         allow_nonfinite: bool = False, generate: int = 0, tokenizer: Any = None,
         forward_keywords: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
         backward: bool = False, loss: Any = None) -> DiffResult:
    """Compare ``candidate`` with ``reference`` node by node on ``inputs``.

    Both models run once while every torch call they make is recorded
    (``introspect.diff.eager``: hooks and private state included), the recorded graphs are
    aligned on the weights they read (no name map needed) and replayed side by side;
    every aligned pair gets its propagated error (each model on its own) and its local
    error (the candidate's node fed the reference's values). Only per-node summaries are
    kept.

    Args:
        reference: the implementation trusted (HF ``BertFor*``, any ``nn.Module``).
        candidate: the implementation checked: any module holding the reference's weights
            (loaded through a key mapping, fused, transposed or cast), or another
            checkpoint of the same architecture.
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors by input name;
            each model gets the inputs its ``forward`` takes.
        atol, rtol: override the per-dtype budgets (``introspect.diff.tolerance.DEFAULTS``).
        noise_budget: also run the reference in float64; each node's budget becomes
            ``noise_factor`` times its own noise in the candidate's dtype (its local error
            when the reference runs in that dtype, against float64), at least ``atol``.
        name_map: help for alignment: candidate node name -> reference node name, or
            candidate parameter path prefix -> reference prefix.
        reference_label, candidate_label: names for tables and reports.
        allow_nonfinite: NaN or Inf in a compared value is a warning in the notes, not a
            failure (by default it fails the diff: equal NaNs prove nothing).
        generate: decode this many tokens greedily, each side with its own key/value cache,
            and compare every step node by node and every layer's cache
            (``introspect.diff.generation``; ``result.steps``, ``result.caches``,
            ``first_divergence.step``). 0: one forward.
        tokenizer: decodes the generated tokens for the reports (``generate`` only).
        forward_keywords: other keyword arguments of each model's forward (reference's,
            candidate's), passed as they are (a cache); the hints that run a model again
            are left out. Used by ``generate`` for each step.
        backward: also compare gradients, node by node and per weight
            (``introspect.diff.backward``): the result's ``backward`` and ``parameters``.
        loss: with ``backward``, ``loss(outputs, inputs) -> scalar`` used for both sides;
            None: the head's own loss with seeded labels (``backward_losses``).

    Returns:
        A ``DiffResult``.

    Raises:
        InputError: a tolerance that is negative or not a number; inputs a model cannot
            take, or that fails on them; two models of different architectures or sizes.

    Example::

        >>> result = introspect.diff(hf_model, my_port, inputs)
        >>> result.first_divergence.layer
        'encoder.layer.3'
    """
    if generate and backward:
        raise InputError("generate does not mix with backward: gradients are compared on one "
                         "forward")
    if generate:
        from introspect.diff.generation import diff_generation

        return diff_generation(reference, candidate, inputs, generate, tokenizer=tokenizer,
                               atol=atol, rtol=rtol, noise_budget=noise_budget,
                               name_map=name_map, reference_label=reference_label,
                               candidate_label=candidate_label,
                               allow_nonfinite=allow_nonfinite)
    tolerance = Tolerance(atol=atol, rtol=rtol, noise_factor=noise_factor)
    tensors = _tensors(inputs)
    reference_label = reference_label or type(reference).__name__
    candidate_label = candidate_label or type(candidate).__name__
    modes = {side: _training_modes(model) for side, model in
             (("reference", reference), ("candidate", candidate))}
    notes = [_training_note(side, training) for side, training in modes.items()
             if any(training.values())]
    original_reference = reference
    reference.eval()
    candidate.eval()
    try:
        noise: dict[str, float] | None = None
        if noise_budget:
            reference, noise = _measure_noise(reference, candidate, tensors)
            notes.append("the reference ran in float64; each node's budget is at least "
                         f"{tolerance.noise_factor:g}x its own noise in the candidate's dtype")
        ref_keywords, cand_keywords = forward_keywords or (None, None)
        ref_graph, ref_inputs, ref_recording = record_for_diff(reference, tensors,
                                                               reference_label, ref_keywords)
        cand_graph, cand_inputs, cand_recording = record_for_diff(candidate, tensors,
                                                                  candidate_label,
                                                                  cand_keywords)
        notes += [f"the {side}'s {note}" for side, graph in
                  (("reference", ref_graph), ("candidate", cand_graph)) for note in graph.notes]
        notes += _input_notes(tensors, ref_inputs, cand_inputs)
        notes += unexercised_notes(tensors, ref_graph, cand_graph)
        alignment = align_graphs(ref_graph, cand_graph, name_map=name_map)
        candidate_dtypes = sorted(_model_dtypes(candidate))
        budgets = _budgets(alignment, ref_graph, cand_graph, tolerance, noise,
                           candidate_dtypes)
        padding = Padding(tensors.get("attention_mask"))
        run = run_side_by_side(ref_graph.gm, cand_graph.gm, alignment.pairs, budgets,
                               ref_inputs, cand_inputs, padding=padding)
        unfaithful = _unfaithful_notes(run, ref_recording, cand_recording)
        notes += unfaithful
        # The run's ShapeProp rewrote every node's shapes; a record changes only where they
        # differ from the recording's (a replay of the same inputs: never, in practice).
        ref_graph.records = refresh_records(ref_graph.records, ref_graph.gm)
        cand_graph.records = refresh_records(cand_graph.records, cand_graph.gm)
        if any(r.layer == "mask" for r in ref_graph.records):
            ref_graph.notes.append(MASK_NOTE)
        notes += alignment.notes
        rows = node_rows(alignment, run, budgets, ref_graph, cand_graph,
                         allow_nonfinite=allow_nonfinite)
        rows = confirm_failures(rows, ref_graph)
        if not any(r.status == STATUS_FAIL for r in rows):
            drift = find_drift(alignment, run, budgets,
                               {r.name: r.index for r in ref_graph.records},
                               _pair_dtypes(alignment, ref_graph, cand_graph),
                               [*_model_dtypes(reference), *candidate_dtypes])
            if drift is not None:
                rows = mark_drift(rows, alignment, drift)
        notes += _nonfinite_notes(rows, allow_nonfinite)
        context = {"reference_model": reference, "candidate_model": candidate,
                   "inputs": ref_inputs, "tolerance": tolerance}
        divergence = first_divergence(rows, alignment, run, ref_graph, cand_graph, padding,
                                      budgets, context=None if forward_keywords else context,
                                      noise_budget=noise_budget)
        gradients = _backward(backward, loss, original_reference, candidate, ref_inputs,
                              cand_inputs, alignment, ref_graph, cand_graph, tolerance,
                              noise_budget, tensors, rows, allow_nonfinite)
    finally:  # every module back in its own mode, not only the top one
        _restore_modes(original_reference, modes["reference"])
        _restore_modes(candidate, modes["candidate"])
    layers = layer_rows(rows, ref_graph.records)
    passed = divergence is None and not any(r.status == STATUS_FAIL for r in rows) \
        and not unfaithful and (gradients is None or gradients.passed)
    return DiffResult(passed, divergence, rows, layers, alignment, ref_graph, cand_graph,
                      tolerance, notes, reference_label, candidate_label, noise_budget,
                      backward=gradients)


def _backward(wanted: bool, loss: Any, reference: torch.nn.Module, candidate: torch.nn.Module,
              ref_inputs: Mapping[str, torch.Tensor], cand_inputs: Mapping[str, torch.Tensor],
              alignment: Alignment, ref_graph: IntrospectGraph, cand_graph: IntrospectGraph,
              tolerance: Tolerance, noise_budget: bool,
              tensors: Mapping[str, torch.Tensor], rows: Sequence[NodeDiff],
              allow_nonfinite: bool = False) -> Any:
    """Gradient parity (``introspect.diff.backward``) when asked for, else None."""
    if not wanted:
        if loss is not None:
            raise InputError("loss= is used only with backward=True")
        return None
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be a callable loss(outputs, inputs) -> scalar, got "
                         f"{type(loss).__name__}")
    from introspect.diff.backward import backward_diff

    return backward_diff(reference, candidate, ref_inputs, cand_inputs, alignment, ref_graph,
                         cand_graph, tolerance, loss=loss, noise_budget=noise_budget,
                         attention_mask=tensors.get("attention_mask"),
                         forward_status={r.reference_node: r.status for r in rows
                                         if r.reference_node and r.candidate_node},
                         allow_nonfinite=allow_nonfinite)


def _pair_dtypes(alignment: Alignment, reference: IntrospectGraph,
                 candidate: IntrospectGraph) -> list[tuple[str, str]]:
    ref_dtypes = {r.name: r.dtype for r in reference.records}
    cand_dtypes = {r.name: r.dtype for r in candidate.records}
    return [(ref_dtypes[p.reference], cand_dtypes[p.candidate]) for p in alignment.pairs]


def _model_dtypes(model: torch.nn.Module) -> set[str]:
    """The floating dtypes a model's weights are held in."""
    return {str(t.dtype).removeprefix("torch.")
            for t in itertools.chain(model.parameters(), model.buffers())
            if t.is_floating_point()}


def _unfaithful_notes(run: Any, *recordings: Recording) -> list[str]:
    """A side whose replay did not reproduce its own run: nothing it says can be trusted.

    A recorded graph runs the same kernels in the same order as the model did, so its
    outputs are the model's to the bit, unless the model draws random numbers (dropout
    left on) or changes its own state as it runs.
    """
    notes = []
    for side, recording in zip(("reference", "candidate"), recordings, strict=True):
        replayed = run.outputs.get(side, {})
        differing = outputs_not_replayed(recording, replayed)
        if differing:
            notes.append(f"the {side} computed other values when run again on the same "
                         f"inputs ({', '.join(differing)} differ): its forward is not "
                         "deterministic (dropout or random numbers left on?) or changes its "
                         "own state as it runs; the diff fails, since no comparison of it "
                         "can be trusted")
    return notes


def _training_modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


def _restore_modes(model: torch.nn.Module, modes: Mapping[str, bool]) -> None:
    for name, module in model.named_modules():
        module.training = modes.get(name, module.training)


def _training_note(side: str, training: Mapping[str, bool]) -> str:
    """Which modules were in training mode (the whole model, or some of its parts)."""
    if training.get(""):
        return (f"the {side} was in training mode; diff ran it in eval mode (dropout off) "
                "and put it back")
    parts = [name for name, on in training.items() if on]
    shown = ", ".join(parts[:3]) + (f" and {len(parts) - 3} more" if len(parts) > 3 else "")
    return (f"the {side} had {len(parts)} module(s) in training mode ({shown}) inside a model "
            "in eval mode; diff ran them in eval mode (dropout off) and put them back")


def _nonfinite_notes(rows: list[NodeDiff], allowed: bool) -> list[str]:
    holding = [r for r in rows if r.nonfinite]
    if not holding:
        return []
    first = holding[0]
    verdict = "allowed by allow_nonfinite (--allow-nonfinite)" if allowed else "the diff fails"
    return [f"NaN or Inf in {len(holding)} compared node(s), first at {first.reference_node} "
            f"({first.op} in {first.module or first.layer}): {verdict}"]


def _tensors(inputs: TokenizedInputs | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(inputs, TokenizedInputs):
        return dict(inputs.tensors)
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("diff needs inputs: introspect.tokenize(...) output or a non-empty "
                         f"mapping of input names to tensors, got {type(inputs).__name__}")
    bad = [k for k, v in inputs.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise InputError(f"inputs must be tensors; {', '.join(map(str, bad))} is not")
    return dict(inputs)


def _input_notes(tensors: Mapping[str, Any], ref_inputs: Mapping[str, Any],
                 cand_inputs: Mapping[str, Any]) -> list[str]:
    notes = []
    for side, taken in (("reference", ref_inputs), ("candidate", cand_inputs)):
        left = [n for n in tensors if n not in taken]
        if left:
            notes.append(f"the {side}'s forward takes no {', '.join(left)}; it ran without")
    return notes


def _measure_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                   tensors: Mapping[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, float]]:
    """The reference in float64, and each of its nodes' noise in the candidate's dtype."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()), torch.float32)
    exact = copy.deepcopy(reference).to(torch.float64).eval()
    rounded = copy.deepcopy(reference).to(dtype).eval()
    ref_graph, ref_inputs, _ = record_for_diff(exact, tensors, "float64")
    low_graph, low_inputs, _ = record_for_diff(rounded, tensors, str(dtype))
    alignment = align_graphs(ref_graph, low_graph)
    unlimited = [Budget(math.inf, 0.0)] * len(alignment.pairs)
    run = run_side_by_side(ref_graph.gm, low_graph.gm, alignment.pairs, unlimited,
                           ref_inputs, low_inputs, snapshots=0)
    noise: dict[str, float] = {}
    for i, pair in enumerate(alignment.pairs):
        stats = run.local.get(i)
        if stats is not None:
            noise[pair.reference] = max(noise.get(pair.reference, 0.0), stats.max_abs)
    return exact, noise


def _budgets(alignment: Alignment, reference: IntrospectGraph, candidate: IntrospectGraph,
             tolerance: Tolerance, noise: Mapping[str, float] | None,
             candidate_dtypes: Sequence[str] = ()) -> list[Budget]:
    """Each pair's budget, in the lower precision of its two values.

    A candidate holding its weights in bf16 rounds to bf16 even where it computes in
    fp32 (an RMSNorm's float32 island): its weights' dtype lowers every float budget.
    """
    ref_records = {r.name: r for r in reference.records}
    cand_records = {r.name: r for r in candidate.records}
    budgets = []
    for pair in alignment.pairs:
        dtype = compare_dtype(ref_records[pair.reference].dtype, cand_records[pair.candidate].dtype)
        if noise is None and dtype in DEFAULTS:
            for weights in candidate_dtypes:
                dtype = compare_dtype(dtype, weights)
        if noise is not None and dtype == "float64":  # the candidate's dtype sets the noise
            dtype = cand_records[pair.candidate].dtype or dtype
        budgets.append(tolerance.budget(dtype, noise.get(pair.reference, 0.0)
                                        if noise is not None else None))
    return budgets


# ---------------------------------------------------------------------------------------
# Tables


__all__ = ["DiffResult", "diff", "record_for_diff"]
