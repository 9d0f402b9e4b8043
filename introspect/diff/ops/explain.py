"""The explanation of a verdict: both recordings aligned, replayed and measured node by node.

The truth runs (``introspect.run.truth``) decide whether two models agree; this module says
where and why they part, on the recordings (``introspect.diff.ops.eager``): align the recorded
graphs on the weights each node reads (``align``), replay them side by side measuring
every pair (``compare``), fail what rounding cannot explain (``drift``), and name the first
divergence (``divergence``) with its likely cause (``introspect.diff.hypotheses``).

A candidate the recorder cannot follow (a scripted or compiled module, weights the
aligner cannot relate; int8 Linears it can: ``quantized``) still gets its verdict from the
truth runs; its explanation is then empty and says why (``Explanation.failure``).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from introspect.diff import devices
from introspect.diff.ops.align import Alignment, align_graphs
from introspect.diff.ops.align.values import pair_by_value
from introspect.diff.ops.compare.padding import Padding
from introspect.diff.ops.compare.replay import run_side_by_side
from introspect.diff.ops.divergence import (
    cancelled_inside,
    confirm_failures,
    confirmed_inside,
    first_divergence,
    is_guess,
    overruled_inside,
)
from introspect.diff.ops.drift import find_drift, mark_drift
from introspect.diff.ops.eager import Recording, outputs_not_replayed, record_forward
from introspect.diff.ops.exercised import unexercised_notes
from introspect.diff.ops.outside import handed_values
from introspect.diff.ops.twins import hold_twins, twin_pairs
from introspect.diff.quantized import INT8, holds_quantized
from introspect.diff.records import STATUS_FAIL, STATUS_UNCONFIRMED, Divergence, NodeDiff
from introspect.diff.repro.capture import ReplaySource
from introspect.diff.tables import node_rows
from introspect.diff.tolerance import DEFAULTS, Budget, Tolerance, compare_dtype
from introspect.errors import InputError
from introspect.graph import MASK_NOTE, IntrospectGraph
from introspect.run.borrowed import borrowed_note, reference_modules_run
from introspect.tracing.shapes import node_records, refresh_records
from introspect.tracing.tracer import CACHE_OFF_NOTE, cache_off


@dataclasses.dataclass(frozen=True)
class Alone:
    """Two modules recorded alone (``ops.inside``): what their own inputs cannot say."""

    attention_mask: torch.Tensor | None  # (B, S): values laid out (B, S, ...) compared there
    context: Mapping[str, Any]  # the whole models and inputs the hypotheses run again


@dataclasses.dataclass
class Explanation:
    """The node-level comparison of the two recordings (empty where it could not run)."""

    rows: list[NodeDiff]
    alignment: Alignment
    graph: IntrospectGraph | None  # the candidate's recorded graph
    recording: Recording | None  # the candidate's recording
    cand_inputs: dict[str, torch.Tensor] | None
    divergence: Divergence | None
    unfaithful: list[str]  # a replay that did not reproduce its own recording
    notes: list[str]
    failure: str = ""  # why there is no explanation
    replay: Any = None  # a repro.ReplaySource: what a replay of the two recordings needs
    # (reference node, candidate node) -> histograms of the local and the propagated error
    histograms: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = \
        dataclasses.field(default_factory=dict)
    # (reference modules that module evidence failed, the candidate's modules it passed,
    # those whose difference cancels in the module holding them, and the rows, by their
    # (reference node, candidate node), whose difference cancels in a module holding them)
    # -> the rows with the guesses inside the failing ones confirmed, those confirmed by
    # growth alone inside the passing ones unconfirmed, the failing ones inside the
    # cancelled ones unconfirmed, and the first divergence among them
    # (``confirmed_inside``, ``overruled_inside``, ``cancelled_inside``)
    confirm_inside: Callable[..., tuple[list[NodeDiff], Divergence | None]] | None = None


def explain(ref_side: tuple[IntrospectGraph, dict[str, torch.Tensor], Recording],
            candidate: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
            candidate_label: str, cand_keywords: Mapping[str, Any] | None,
            tolerance: Tolerance, noise: Mapping[str, float] | None,
            candidate_dtypes: Sequence[str], *, name_map: Mapping[str, str] | None,
            allow_nonfinite: bool, forward_keywords: Any, noise_budget: bool,
            reference: torch.nn.Module, raise_errors: bool,
            agreeing_outputs: Collection[str] = (), placement: Any = None,
            recording: Recording | None = None,
            original_reference: torch.nn.Module | None = None,
            recorder: Callable[..., Recording] = record_forward,
            alone: Alone | None = None, repeatable: bool = False) -> Explanation:
    """Record the candidate, align it with the reference's recording and measure each pair.

    ``raise_errors``: without truth runs (a generation step) a failure to record or align
    is the caller's error; with them, it only leaves the explanation empty.
    ``agreeing_outputs``: the reference's outputs the truth runs found within budget. ``placement``:
    where each model runs (``introspect.diff.devices``); values are compared on the
    reference's device. ``recording``: the candidate's run, recorded already.
    ``original_reference``: the user's reference, where ``reference`` is a float64 copy of
    it (a port that runs the user's model inside is noted, ``introspect.run.borrowed``).
    ``recorder``: how the candidate is recorded (``record_forward``'s signature; the
    backward diff's records with autograd on, so that one recorded forward serves both
    comparisons). ``alone``: the two are modules recorded alone (``ops.inside``), their
    inputs the values module evidence judged them on: the mask and the whole models come
    from it, and no note is made on inputs the user never named. ``repeatable``: the
    candidate's own calls returned the same outputs bit for bit (``Truth.repeatable``):
    the hints do not run it twice more to look for a dropout left on.
    """
    ref_graph, ref_inputs, ref_recording = ref_side
    try:
        # A torch.compile module is recorded through the module it compiled: the same
        # code, run eagerly (dynamo would trace the recorder itself). Whether that
        # recording reproduces the compiled calls is checked like any other's.
        recorded = getattr(candidate, "_orig_mod", candidate)
        where = placement.candidate_device if placement is not None \
            else devices.model_device(candidate)
        with reference_modules_run(original_reference or reference) as borrowed:
            cand_graph, cand_inputs, cand_recording = record_for_diff(
                recorded, {k: v.clone() for k, v in devices.to_device(tensors, where).items()},
                candidate_label, cand_keywords,
                recording, recorder)
        alignment = align_graphs(ref_graph, cand_graph, name_map=name_map)
    except Exception as e:  # noqa: BLE001  the recorder or aligner could not follow it
        if raise_errors:
            raise
        return _unexplained(ref_graph, candidate, _one_line(e))
    notes = side_notes(ref_graph, cand_graph)
    borrowed_line = borrowed_note(borrowed, ref_graph.title)
    notes += [borrowed_line] if borrowed_line else []
    handed = len(handed_values(cand_graph.gm))
    if handed:
        notes.append(f"the candidate's recording was handed {handed} value(s) computed where "
                     "it does not reach (a worker thread, NumPy, TorchScript, vmap): the ops "
                     "that computed them "
                     "are not compared, only what they returned (as a value of the model)")
    if alone is None:
        notes += _input_notes(tensors, ref_inputs, cand_inputs)
        notes += unexercised_notes(tensors, ref_graph, cand_graph)
    mask = tensors.get("attention_mask") if alone is None else alone.attention_mask
    padding = Padding(mask)

    def measure(alignment: Alignment) -> tuple[Any, list[Budget], list[NodeDiff], list[str],
                                               list[str], list[str]]:
        """Replay both recordings side by side on ``alignment``'s pairs: the rows."""
        measured_notes: list[str] = []
        budgets = _budgets(alignment, ref_graph, cand_graph, tolerance, noise, candidate_dtypes)
        rounding: list[str] = []
        if placement is not None:  # TF32 on CUDA: matmuls get their own budget
            rounding = devices.rounding_dtypes(placement, reference, candidate)
            budgets = devices.device_budgets(budgets, alignment.pairs, ref_graph, cand_graph,
                                             tolerance, rounding, noise is not None)
            measured_notes += devices.device_notes(placement, rounding, tolerance)
        run = run_side_by_side(ref_graph.gm, cand_graph.gm, alignment.pairs, budgets,
                               {k: v.clone() for k, v in ref_inputs.items()},
                               {k: v.clone() for k, v in cand_inputs.items()}, padding=padding)
        # an int8 Linear's budget comes from the input it ran on
        # (``compare.replay.Runner._int8_budgets``)
        budgets = [run.budgets.get(i, budget) for i, budget in enumerate(budgets)]
        unfaithful = _unfaithful_notes(run, ref_recording, cand_recording)
        measured_notes += unfaithful
        # The run's ShapeProp rewrote every node's shapes; a record changes only where they
        # differ from the recording's (a replay of the same inputs: never, in practice).
        ref_graph.records = refresh_records(ref_graph.records, ref_graph.gm)
        cand_graph.records = refresh_records(cand_graph.records, cand_graph.gm)
        if any(r.layer == "mask" for r in ref_graph.records) and MASK_NOTE not in ref_graph.notes:
            ref_graph.notes.append(MASK_NOTE)
        rows = node_rows(alignment, run, budgets, ref_graph, cand_graph,
                         allow_nonfinite=allow_nonfinite)
        if noise is None and INT8 not in candidate_dtypes:  # (int8: its own budgets)
            rows, budgets = hold_twins(rows, alignment, run,
                                       twin_pairs(alignment, ref_graph, cand_graph),
                                       _pair_dtypes(alignment, ref_graph, cand_graph), budgets)
        rows = confirm_failures(rows, ref_graph, agreeing_outputs)
        return run, budgets, rows, measured_notes, rounding, unfaithful

    try:
        run, budgets, rows, measured, rounding, unfaithful = measure(alignment)
        better = pair_by_value(alignment, rows, ref_graph, cand_graph, ref_inputs, cand_inputs)
        if better is not None:  # guessed pairs re-paired by value: measured again on them
            alignment = better
            run, budgets, rows, measured, rounding, unfaithful = measure(alignment)
    except InputError as e:  # a recording its replay cannot run (module calls that two
        # worker threads interleaved, probe round o): the plain calls ran, and decide
        if raise_errors:
            raise
        return _unexplained(ref_graph, candidate, _one_line(e), replayed=True)
    notes += measured + alignment.notes
    if not any(r.status == STATUS_FAIL for r in rows):
        drift = find_drift(alignment, run, budgets,
                           {r.name: r.index for r in ref_graph.records},
                           _pair_dtypes(alignment, ref_graph, cand_graph),
                           [*model_dtypes(reference), *candidate_dtypes, *rounding],
                           {r.reference_node for r in rows if r.status == STATUS_UNCONFIRMED
                            or is_guess(r)})  # (a guess's values, its view's, prove nothing)
        if drift is not None:
            rows = mark_drift(rows, alignment, drift)
    notes += _nonfinite_notes(rows, allow_nonfinite, trusted=not unfaithful)
    context = {"reference_model": reference, "candidate_model": candidate,
               "inputs": ref_inputs, "tolerance": tolerance} if alone is None \
        else {**alone.context, "tolerance": tolerance}
    context["repeatable"] = repeatable
    divergence = first_divergence(rows, alignment, run, ref_graph, cand_graph, padding,
                                  budgets, context=None if forward_keywords else context,
                                  noise_budget=noise_budget)
    histograms = {(p.reference, p.candidate): (run.local[i].histogram, run.propagated[i].histogram)
                  for i, p in enumerate(alignment.pairs) if i in run.local and i in run.propagated}
    if run.orders or run.axis_orders:  # the orders the run found kept on the pairs: the
        # backward reads them
        alignment = dataclasses.replace(alignment, pairs=[
            dataclasses.replace(p, feature_order=run.orders.get(i, p.feature_order),
                                axis_order=run.axis_orders.get(i, p.axis_order))
            for i, p in enumerate(alignment.pairs)])
    replay = ReplaySource(ref_inputs, cand_inputs, budgets, mask)

    def confirm_inside(modules: Collection[str], passing: Collection[str] = (),
                       cancelled: Collection[str] = (),
                       cancelled_rows: Collection[tuple[str, str]] = (),
                       ) -> tuple[list[NodeDiff], Divergence | None]:
        modules_of = {r.name: r.module for r in cand_graph.records}
        confirmed = cancelled_inside(
            overruled_inside(confirmed_inside(rows, modules), passing, modules_of),
            cancelled, modules_of, cancelled_rows)
        return confirmed, first_divergence(
            confirmed, alignment, run, ref_graph, cand_graph, padding, budgets,
            context=None if forward_keywords else context, noise_budget=noise_budget)

    return Explanation(rows, alignment, cand_graph, cand_recording, cand_inputs, divergence,
                       unfaithful, notes, replay=replay, histograms=histograms,
                       confirm_inside=confirm_inside)


def _unexplained(ref_graph: IntrospectGraph, candidate: torch.nn.Module,
                 why: str, replayed: bool = False) -> Explanation:
    kind = _kind(candidate)
    could_not = ": its recording could not be replayed" if replayed \
        else " could not be recorded or aligned"
    note = (f"no node-level explanation: the candidate{kind}{could_not} ({why}); the "
            "verdict comes from the two models' own calls, compared output by output")
    tensor_nodes = sum(1 for r in ref_graph.records if r.kind != "shape")
    alignment = Alignment([], [], [], [], reference_tensor_nodes=max(tensor_nodes, 1))
    return Explanation([], alignment, None, None, None, None, [], [note], failure=why)


def _kind(model: torch.nn.Module) -> str:
    if isinstance(model, torch.jit.ScriptModule):
        return " (a TorchScript module)"
    if type(model).__name__ == "OptimizedModule":
        return " (a torch.compile module)"
    if any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules()):
        return " (quantized)"
    return ""


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    text = text if len(text) <= 160 else text[:159] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__



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
        budgets.append(tolerance.node_budget(dtype, noise.get(pair.reference, 0.0)
                                        if noise is not None else None))
    return budgets


def _pair_dtypes(alignment: Alignment, reference: IntrospectGraph,
                 candidate: IntrospectGraph) -> list[tuple[str, str]]:
    ref_dtypes = {r.name: r.dtype for r in reference.records}
    cand_dtypes = {r.name: r.dtype for r in candidate.records}
    return [(ref_dtypes[p.reference], cand_dtypes[p.candidate]) for p in alignment.pairs]


def model_dtypes(model: torch.nn.Module) -> set[str]:
    """The floating dtypes a model's weights are held in, and ``qint8`` where it holds
    int8 quantized Linears (their rounding has limits of its own: ``drift``, ``outputs``)."""
    found = {str(t.dtype).removeprefix("torch.")
             for t in itertools.chain(model.parameters(), model.buffers())
             if t.is_floating_point()}
    return found | ({INT8} if holds_quantized(model) else set())


# What the note on a replay that did not reproduce its recording says (read by
# ``DiffResult.replay_reproduced``).
UNREPRODUCED = "replay computed other values than its recording"


def _unfaithful_notes(run: Any, *recordings: Recording) -> list[str]:
    """A side whose replay did not reproduce its own run: nothing it says can be trusted.

    A recorded graph runs the same kernels in the same order as the model did, so its
    outputs are the model's to the bit, unless the model draws random numbers (dropout
    left on), changes its own state as it runs, or runs a region under a state the ops
    recorded do not hold (``torch.autocast``: the casts it makes are not recorded).
    """
    notes = []
    for side, recording in zip(("reference", "candidate"), recordings, strict=True):
        replayed = run.outputs.get(side, {})
        differing = outputs_not_replayed(recording, replayed)
        if differing:
            notes.append(f"the {side}'s {UNREPRODUCED} on "
                         f"the same inputs ({', '.join(differing)} differ): its forward "
                         "draws random numbers (dropout left on?), changes its own state as "
                         "it runs, or runs a region the replay runs otherwise (an autocast "
                         "region, compiled code, weights swapped in by functional_call); "
                         "no node-level "
                         "comparison of it can be trusted, and the plain calls and module "
                         "evidence decide")
    return notes


def _nonfinite_notes(rows: list[NodeDiff], allowed: bool, trusted: bool = True) -> list[str]:
    """The note on NaN or Inf in compared nodes; where the replay did not reproduce its
    recording (``trusted`` False: a template's own uninitialised weights replayed for
    those ``functional_call`` swapped in), it decides nothing and says so."""
    holding = [r for r in rows if r.nonfinite]
    if not holding:
        return []
    first = holding[0]
    verdict = "allowed by allow_nonfinite (--allow-nonfinite)" if allowed else \
        "the diff fails" if trusted else \
        "in a replay that did not reproduce its recording, which decides nothing"
    return [f"NaN or Inf in {len(holding)} compared node(s), first at {first.reference_node} "
            f"({first.op} in {first.module or first.layer}): {verdict}"]


def _input_notes(tensors: Mapping[str, Any], ref_inputs: Mapping[str, Any],
                 cand_inputs: Mapping[str, Any]) -> list[str]:
    notes = []
    for side, taken in (("reference", ref_inputs), ("candidate", cand_inputs)):
        left = [n for n in tensors if n not in taken]
        if left:
            notes.append(f"the {side}'s forward takes no {', '.join(left)}; it ran without")
    return notes


def record_for_diff(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor],
                    title: str, keywords: Mapping[str, Any] | None = None,
                    recording: Recording | None = None,
                    recorder: Callable[..., Recording] = record_forward,
                    ) -> tuple[IntrospectGraph, dict[str, torch.Tensor], Recording]:
    """Run ``model`` once and record what it ran (``introspect.diff.ops.eager``).

    The diff works on what the model really computes on these inputs: its hooks,
    private state, globals and Python branches included, and no graph is cached or
    replayed from another layer. ``recording``: that run, made already by the caller
    (``generation``'s steps: a step runs once, its cache must not be updated twice).
    ``recorder``: makes the recording, called as ``record_forward`` is.
    """
    accepted = accepted_inputs(model, tensors)
    if not accepted:
        raise InputError(f"{type(model).__name__}.forward takes none of the inputs "
                         f"{', '.join(tensors)}")
    cache_note = keywords is None and bool(cache_off(model, accepted))
    if keywords is None:  # a decoder's cache on by default: one forward without it
        keywords = cache_off(model, accepted)
    if recording is None:
        recording = recorder(model, accepted, title, keywords)
    notes = [*recording.notes, *([CACHE_OFF_NOTE] if cache_note else [])]
    graph = IntrospectGraph(recording.gm, node_records(recording.gm), recording.input_names,
                            recording.output_names, notes=notes, title=title)
    return graph, accepted, recording


def accepted_inputs(model: torch.nn.Module,
                     tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inputs ``model.forward`` takes by name (all of them when it takes ``**kwargs``).

    A TorchScript module's forward has no Python signature: its schema names the
    arguments instead (``self`` first).
    """
    try:
        names = set(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        schema = getattr(getattr(model, "forward", None), "schema", None)
        arguments = [a.name for a in getattr(schema, "arguments", [])][1:]
        return {name: t for name, t in tensors.items() if name in arguments} \
            if arguments else dict(tensors)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in names):
        return dict(tensors)
    taken = {p.name for p in names}
    return {name: t for name, t in tensors.items() if name in taken}



def side_notes(reference: IntrospectGraph, candidate: IntrospectGraph) -> list[str]:
    """Each graph's notes, named by its side: "the reference's attention mask is ..." (a
    note's own "the" dropped: "the reference's the attention mask" read as a slip)."""
    return [f"the {side}'s {note.removeprefix('the ')}" for side, graph in
            (("reference", reference), ("candidate", candidate)) for note in graph.notes]

__all__ = ["Alone", "Explanation", "accepted_inputs", "explain", "model_dtypes", "record_for_diff",
           "side_notes"]
