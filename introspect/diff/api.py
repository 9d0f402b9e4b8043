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

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from introspect.diff import devices
from introspect.diff.copies import cast_copy
from introspect.diff.int8_outputs import explained_by_int8
from introspect.diff.modules import ModuleEvidence, gather_module_evidence
from introspect.diff.modules.accounted import unaccounted
from introspect.diff.modules.evidence import coverage
from introspect.diff.modules.tables import modules_only
from introspect.diff.ops.align import Alignment, align_graphs
from introspect.diff.ops.compare.replay import run_side_by_side
from introspect.diff.ops.eager import Recording, record_forward
from introspect.diff.ops.explain import accepted_inputs, explain, model_dtypes, record_for_diff
from introspect.diff.ops.faithful import (
    faithful_recordings,
    recorded_call_verdict,
    truth_divergence,
)
from introspect.diff.outputs import NoOutputPairs, compare_truths
from introspect.diff.quantized import INT8
from introspect.diff.records import STATUS_FAIL, NodeDiff
from introspect.diff.result import DiffResult, backward_divergence
from introspect.diff.tables import layer_rows
from introspect.diff.tolerance import Budget, Tolerance
from introspect.errors import InputError
from introspect.graph import IntrospectGraph
from introspect.models.load import TokenizedInputs
from introspect.models.ports import describe_changes
from introspect.run import footprint, switches
from introspect.run.boundaries import where_paths_part
from introspect.run.capture import capture_calls
from introspect.run.deferred import Deferred
from introspect.run.reference import ReferenceChanged, check_reference_again
from introspect.run.truth import edited_weights, identical, run_truth, weight_sums
from introspect.tracing.tracer import holds_trace_lock

# ---------------------------------------------------------------------------------------
# Recording for a diff




def _copies(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of each input: every call and every replay gets its own."""
    return {name: tensor.clone() for name, tensor in tensors.items()}


def built(candidate: Any) -> Any:
    """The candidate model, built now if it was handed over ``Deferred``."""
    return candidate.build() if isinstance(candidate, Deferred) else candidate




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
         backward: bool = False, loss: Any = None, device: Any = None,
         candidate_device: Any = None,
         recordings: tuple[Recording, Recording] | None = None,
         nproc: int | None = None, nodes: bool = True) -> DiffResult:
    """Compare ``candidate`` with ``reference`` node by node on ``inputs``.

    Both models run once while every torch call they make is recorded
    (``introspect.diff.ops.eager``: hooks and private state included), the recorded graphs are
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
        atol, rtol: widen the outputs' budget (``introspect.diff.tolerance.DEFAULTS`` per
            dtype); every node inside the models keeps its noise-model budget.
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
        recordings: each side's run on ``inputs`` (with ``forward_keywords``), recorded
            already (``record_forward``); the models are not run again. Used by
            ``generate`` for a step whose quick comparison found a difference.
        device: run both models there ("cpu", "cuda", "cuda:1"); None: where they are.
        candidate_device: run the candidate there (the reference stays on ``device``);
            values are compared on the reference's device, moved one pair at a time, and
            put back afterwards (``introspect.diff.devices``).
        nproc: run the candidate on this many ranks under ``torch.distributed``
            (``introspect.diff.parallel``): ``candidate`` is then a port,
            ``"path/to/port.py:NAME"`` or a top-level ``build(reference)`` function, built
            on every rank; ``reference`` may be the ``LoadedReference`` it takes.
        nodes: node tables on every verdict (``result.nodes``, ``result.layers`` by node).
            False: a PASS that the outputs and module evidence prove (every value the
            candidate computed accounted for: ``modules.accounted``) records and replays
            nothing; its rows are empty, ``result.modules`` has the evidence and a note
            says so. Anything else (a FAIL, a module over budget, code no module evidence
            judged) gets the node tables all the same. ``introspect diff`` without
            ``--out``, ``--nodes``, ``--json``, ``--junit`` or ``--repro`` asks for none.

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
    if nproc is not None:  # a tensor-parallel port: its own mode
        from introspect.diff.parallel import diff_parallel

        if generate or backward or noise_budget:
            raise InputError("nproc does not mix with generate, backward or noise_budget")
        return diff_parallel(reference, candidate, inputs, nproc, atol=atol, rtol=rtol,  # type: ignore[no-any-return]
                             reference_label=reference_label, candidate_label=candidate_label,
                             allow_nonfinite=allow_nonfinite)
    devices.check_modes(device, candidate_device, generate, backward)
    if generate and backward:
        raise InputError("generate does not mix with backward: gradients are compared on one "
                         "forward")
    if generate:
        from introspect.diff.generation import diff_generation

        return diff_generation(reference, built(candidate), inputs, generate,
                               diff_forward=diff, tokenizer=tokenizer, atol=atol, rtol=rtol,
                               noise_budget=noise_budget, name_map=name_map,
                               reference_label=reference_label,
                               candidate_label=candidate_label,
                               allow_nonfinite=allow_nonfinite)
    tolerance = Tolerance(atol=atol, rtol=rtol, noise_factor=noise_factor)
    callers = _tensors(inputs)
    tensors = _copies(callers)  # nothing below ever hands the caller's tensors to a model
    deferred = candidate if isinstance(candidate, Deferred) else None
    reference_label = reference_label or type(reference).__name__
    candidate_label = candidate_label or (deferred.label if deferred is not None
                                          else type(candidate).__name__)
    modes = {"reference": _training_modes(reference)}
    original_reference = reference
    reference.eval()
    truths = forward_keywords is None  # a generation step: the loop runs its own
    ref_keywords, cand_keywords = forward_keywords or (None, None)
    placement = None
    try:
        if deferred is not None and (device is not None or candidate_device is not None):
            candidate, deferred = deferred.build(), None  # both models move together
        if deferred is None:
            placement = devices.place(reference, candidate, device, candidate_device)
        ref_tensors = _copies(devices.to_device(tensors, placement.reference_device
                                                if placement else
                                                devices.model_device(reference)))
        # The reference first, clean: its truth and its recording come before the
        # candidate's code is imported or built (``introspect.run.deferred``).
        ref_accepted = accepted_inputs(reference, ref_tensors)
        with capture_calls(reference) as ref_calls:  # module evidence: what each module saw
            ref_truth = run_truth(reference, ref_accepted,
                                  lean=not _compiled(reference)) if truths else None
        ref_given, cand_given = recordings or (None, None)
        # With backward, one forward per side recorded with autograd on serves both
        # comparisons; the reference's backward runs now, before the candidate is built.
        gradients_with = _one_forward_for_both(backward, loss, noise_budget, recordings)
        # Without node tables asked for, the reference is recorded only where a PASS is not
        # proven without it, after checking it still computes what it did clean.
        later = not nodes and truths and recordings is None and not backward \
            and device is None and candidate_device is None
        # What the reference computes with, read before the candidate's build and calls: a
        # PASS proven without running the reference after them calls it again only where
        # something it reads moved (``run.footprint``; the call adds no evidence there).
        before_candidate = footprint.take(reference) if later else None
        ref_side = None if noise_budget or later else \
            record_for_diff(reference, _copies(ref_tensors), reference_label, ref_keywords,
                            ref_given, gradients_with or record_forward)
        ref_gradients, loss_inputs = None, None
        if gradients_with is not None:
            assert ref_side is not None
            loss_inputs = _copies(ref_tensors)
            ref_gradients = _gradients_now(reference, ref_side, loss, loss_inputs)
        switched: dict[str, Any] = {}
        if deferred is not None:
            before_build = switches.snapshot()
            candidate = deferred.build()
            switched = switches.flipped(before_build, switches.snapshot())
            if switched and ref_truth is not None:  # before anything replays the reference
                _reference_again(original_reference, ref_accepted, ref_truth, switched,
                                 candidate_label)
            placement = devices.place(reference, candidate)  # nothing moves
        assert placement is not None
        cand_tensors = _copies(devices.to_device(tensors, placement.candidate_device))
        modes["candidate"] = _training_modes(candidate)
        notes = [_training_note(side, training) for side, training in modes.items()
                 if any(training.values())]
        candidate.eval()
        noise: dict[str, float] | None = None
        if noise_budget:
            reference, noise = _measure_noise(reference, candidate, tensors)
            notes.append("the reference ran in float64; each node's budget is at least "
                         f"{tolerance.noise_factor:g}x its own noise in the candidate's dtype")
            ref_side = record_for_diff(
                reference, devices.to_device(tensors, devices.model_device(reference)),
                reference_label, ref_keywords)
        candidate_dtypes = sorted(model_dtypes(candidate))
        verdict = None
        unpaired: NoOutputPairs | None = None
        if truths:
            sums = weight_sums(candidate)
            with _switches_named(switched, candidate_label), \
                    capture_calls(candidate, share=ref_calls) as cand_calls:
                cand_truth = run_truth(candidate, accepted_inputs(candidate, cand_tensors),
                                       grad_calls=2, inference=not _holds_script(candidate),
                                       lean=not _compiled(candidate))
            edited = edited_weights(sums, weight_sums(candidate))
            if edited:  # named as such, not as dropout or a weight left unloaded
                shown = describe_changes(edited, most=3)
                notes.append(f"the {candidate_label}'s forward edits its own weights ({shown}): "
                             "they changed during its calls, so each call computes with other "
                             "values")
            assert ref_truth is not None
            judge_dtypes = [*model_dtypes(original_reference), *candidate_dtypes,
                            *devices.rounding_dtypes(placement, reference, candidate)]

            def judge(truth: Any, against: Any = None) -> Any:
                return compare_truths(against or ref_truth, truth, tolerance, judge_dtypes,
                                      allow_nonfinite, (reference_label, candidate_label),
                                      tensors.get("attention_mask"))
            try:
                verdict = judge(cand_truth)
                notes += verdict.notes
            except NoOutputPairs as e:  # the alignment's words first (other sizes, ...)
                unpaired, truths = e, False
            if switched and verdict is not None:
                notes.append(_judged_with_switches_back(
                    verdict, judge, candidate, accepted_inputs(candidate, cand_tensors),
                    before_build, switched, candidate_label))
        module_evidence, fast = ModuleEvidence(), None
        device_rounding = devices.rounding_dtypes(placement, reference, candidate)
        early = later and verdict is not None and verdict.passed and not switched \
            and INT8 not in candidate_dtypes
        if early:  # module evidence first: with it, the PASS may need no recording
            module_evidence = gather_module_evidence(
                ref_calls, cand_calls, tensors.get("attention_mask"), keep_calls=True,
                rounding=device_rounding)
            unproven = _unproven(module_evidence, ref_calls, cand_calls)
            if not unproven:
                notes += module_evidence.notes
                notes.append(MODULES_ONLY_NOTE)
                ref_calls.calls.clear()  # the values are let go: memory
                cand_calls.calls.clear()
                if before_candidate is None or footprint.moved(before_candidate,
                                                               original_reference):
                    _reference_again(original_reference, ref_accepted, ref_truth, switched,
                                     candidate_label)
                fast = modules_only(module_evidence)
        if ref_side is None and fast is None:  # the recording is needed after all
            assert ref_truth is not None
            _reference_again(original_reference, ref_accepted, ref_truth, switched,
                             candidate_label)  # what the candidate's calls left behind
            ref_side = record_for_diff(reference, _copies(ref_tensors), reference_label,
                                       ref_keywords)
        if fast is None:  # the full path: the op-level recording explains
            assert ref_side is not None  # (recorded above where the fast path was not taken)
            explanation = explain(ref_side, candidate, tensors, candidate_label, cand_keywords,
                                  tolerance, noise, candidate_dtypes, name_map=name_map,
                                  allow_nonfinite=allow_nonfinite,
                                  forward_keywords=forward_keywords,
                                  noise_budget=noise_budget, reference=reference,
                                  raise_errors=verdict is None,
                                  agreeing_outputs=(),  # see docs/verdict.md: not yet sound
                                  placement=placement, recording=cand_given,
                                  original_reference=original_reference,
                                  recorder=gradients_with if gradients_with is not None
                                  and getattr(candidate, "_orig_mod", None) is None
                                  else record_forward)
            notes += explanation.notes
            if unpaired is not None:
                raise unpaired
            faithful, parted, random = True, None, False
            if truths:
                assert ref_truth is not None and verdict is not None
                faithful, faith_notes, parted = faithful_recordings(
                    ref_truth, ref_side[2], cand_truth, explanation.recording, candidate,
                    accepted_inputs(candidate, cand_tensors), (reference_label, candidate_label),
                    noise_budget)
                notes += faith_notes
                late = recorded_call_verdict(judge, cand_truth, explanation.recording,
                                             candidate_label)
                if verdict.passed and late is not None:  # another call of its, over budget
                    verdict.passed, random = False, True
                    verdict.reasons.append("changes from call to call")
                    notes.append(late)
            rows = explanation.rows
            divergence = explanation.divergence
            explained_passed = divergence is None \
                and not any(r.status == STATUS_FAIL for r in rows) and not explanation.unfaithful
            if verdict is not None and not verdict.passed and explained_passed \
                    and explanation.graph is not None and INT8 in candidate_dtypes:
                explained = explained_by_int8(
                    verdict, original_reference, candidate, cand_truth,
                    explanation.alignment.relations, ref_accepted,
                    lambda ref, cand: judge(cand, ref), (reference_label, candidate_label))
                if explained is not None:  # the hybrid reference computes the candidate's outputs
                    verdict = explained
                    notes.append(explained.notes[-1])
                else:
                    notes.append(_int8_outputs_note(verdict))
            gradients = _backward(backward, loss, original_reference, candidate,
                                  _copies(ref_side[1]),
                                  _copies(explanation.cand_inputs or {}), explanation.alignment,
                                  ref_side[0], explanation.graph, tolerance, noise_budget,
                                  tensors, rows, allow_nonfinite, ref_gradients,
                                  getattr(explanation.recording, "run", None), loss_inputs)
            if verdict is None:
                passed = explained_passed
            elif explanation.graph is not None and faithful:
                passed = verdict.passed and explained_passed
            else:
                passed = verdict.passed
            random = random or bool(truths and cand_truth.changed_between_calls())
            if verdict is not None and not verdict.passed \
                    and (divergence is None or (not faithful and not random)):
                # (a forward that changes from call to call cannot be reproduced by any
                # recording: its node-level divergence, dropout's hint and all, stands)
                if parted is None:  # where a plain call leaves the recorded path, if anywhere
                    parted = where_paths_part(candidate, accepted_inputs(candidate, cand_tensors))
                divergence = truth_divergence(verdict, parted, explanation.alignment.relations)
            # Module evidence (tier 2): each module of the candidate's plain calls on the
            # reference's inputs to it, against a budget from its own rounding noise.
            if early:  # judged before the recording: only its coverage waited for it
                module_evidence.uncovered = coverage(cand_calls, module_evidence.rows,
                                                     faithful, parted)
                ref_calls.calls.clear()  # the values are let go: memory
                cand_calls.calls.clear()
            elif truths:
                module_evidence = gather_module_evidence(  # (it lets go of the calls' values)
                    ref_calls, cand_calls, tensors.get("attention_mask"), faithful, parted,
                    rounding=device_rounding)
            notes += module_evidence.notes
            if explanation.confirm_inside is not None and not module_evidence.passed \
                    and (divergence is None or divergence.layer == "outputs"):
                # a failing module proves its fault: a guess inside it may name the node
                confirmed, inside = explanation.confirm_inside(
                    {r.reference_module for r in module_evidence.smallest_failing()})
                if inside is not None:
                    rows, divergence = confirmed, inside
            passed, divergence = module_evidence.join(passed, divergence, faithful)
            if ref_truth is not None:  # the reference once more: what the candidate left behind
                _reference_again(original_reference, ref_accepted, ref_truth, switched,
                                 candidate_label)
    finally:  # every module back in its own mode and on its own device
        if placement is not None:
            placement.restore()
        _restore_modes(original_reference, modes["reference"])
        if "candidate" in modes:
            _restore_modes(candidate, modes["candidate"])
    changed = [name for name, tensor in _tensors(inputs).items()
               if not identical(tensor, tensors[name])]
    if changed:  # never: every model got a copy; a guard on that promise
        raise InputError(f"the inputs {', '.join(changed)} changed during the diff")
    if fast is not None:  # a PASS the outputs and module evidence prove: no node rows
        assert verdict is not None
        return DiffResult(True, None, [], fast.layers, fast.alignment, None, None, tolerance,
                          notes, reference_label, candidate_label, noise_budget,
                          output_rows=verdict.rows, module_evidence=module_evidence,
                          op_level=False)
    assert ref_side is not None
    layers = layer_rows(rows, ref_side[0].records)
    passed = passed and (gradients is None or gradients.passed)
    if divergence is None and gradients is not None and gradients.first_divergence is not None:
        divergence = backward_divergence(gradients.first_divergence)  # what decided
    return DiffResult(passed, divergence, rows, layers, explanation.alignment, ref_side[0],
                      explanation.graph, tolerance, notes, reference_label, candidate_label,
                      noise_budget, backward=gradients,
                      output_rows=verdict.rows if verdict is not None else [],
                      replay=explanation.replay, histograms=explanation.histograms,
                      module_evidence=module_evidence)


MODULES_ONLY_NOTE = (
    "no op-level recording: the outputs and module evidence prove this PASS (every module "
    "within its budget, and every value between them the reference's own or a judged "
    "module's); for node tables pass nodes=True (introspect diff: --out or --nodes)")


def _unproven(evidence: ModuleEvidence, ref_calls: Any, cand_calls: Any) -> list[str]:
    """Why a PASS cannot rest on module evidence alone ([]: it can)."""
    if not evidence.passed:
        return ["a module is over its budget"]
    if evidence.uncovered:
        return ["a region the recording could not see"]
    if evidence.notes:
        return evidence.notes
    if evidence.unrelated:  # a weight of its own: a module over it may still agree
        return [f"weights that hold none of the reference's ({', '.join(evidence.unrelated[:3])})"]
    if not any(r.status == "ok" for r in evidence.rows):
        return ["no module evidence"]
    return unaccounted(ref_calls, cand_calls, evidence.rows)


def _judged_with_switches_back(verdict: Any, judge: Any, candidate: torch.nn.Module,
                               inputs: Mapping[str, torch.Tensor], before: Mapping[str, Any],
                               switched: Mapping[str, Any], label: str) -> str:
    """The candidate called once more with every switch its build flipped put back, judged
    like its other calls (``run.switches``): the note that says so."""
    shown = switches.describe(switched)
    with switches.put_back(before):
        again = run_truth(candidate, inputs, lean=not _compiled(candidate))
    judged = judge(again)
    if judged.passed:
        return (f"the {label}'s build switched {shown} for the whole process: the reference "
                "computes the same under it (checked again), and the candidate, called once "
                "more with it put back, agrees too")
    verdict.passed = False
    verdict.reasons.append("rests on a switch its build flipped")
    verdict.rows += [dataclasses.replace(r, call=f"{r.call}, {', '.join(switched)} put back")
                     for r in judged.rows if r.status == STATUS_FAIL]  # what decided
    worst = judged.worst_failing()
    where = f" ({worst.reference_output} off by {worst.max_abs_err:.3g})" if worst else ""
    return (f"the {label}'s build switched {shown} for the whole process, and with it put "
            f"back the candidate's outputs part from the reference's{where}: its parity "
            "rests on the switch")


@contextlib.contextmanager
def _switches_named(switched: Mapping[str, Any], label: str) -> Iterator[None]:
    """A candidate that cannot run under the switches its build flipped: said so, naming
    them (its class may share the reference's name: the error would read as the
    reference's)."""
    try:
        yield
    except InputError as e:
        if not switched:
            raise
        cause = str(e).split(". ")[0].rstrip(".")
        raise InputError(f"the {label}'s build switched {switches.describe(switched)} for "
                         f"the whole process, and it cannot run so: {cause}") from e


def _reference_again(reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                     truth: Any, switched: Mapping[str, Any], label: str) -> None:
    """``check_reference_again``, its message naming the switches the build flipped."""
    try:
        check_reference_again(reference, inputs, truth)
    except InputError as e:
        if not switched:
            raise
        what = "the reference's own outputs move under it" if isinstance(e, ReferenceChanged) \
            else "the reference cannot run under it (" + \
            str(e).split(": ", 1)[-1].split(". ")[0].rstrip(".") + ")"
        raise ReferenceChanged(
            f"the {label}'s build switched {switches.describe(switched)} for the whole "
            f"process, and {what}; no verdict") from e


def _backward(wanted: bool, loss: Any, reference: torch.nn.Module, candidate: torch.nn.Module,
              ref_inputs: Mapping[str, torch.Tensor], cand_inputs: Mapping[str, torch.Tensor],
              alignment: Alignment, ref_graph: IntrospectGraph,
              cand_graph: IntrospectGraph | None, tolerance: Tolerance, noise_budget: bool,
              tensors: Mapping[str, torch.Tensor], rows: Sequence[NodeDiff],
              allow_nonfinite: bool = False, ref_gradients: Any = None,
              candidate_run: Any = None,
              loss_inputs: Mapping[str, torch.Tensor] | None = None) -> Any:
    """Gradient parity (``introspect.diff.backward``) when asked for, else None."""
    if not wanted:
        if loss is not None:
            raise InputError("loss= is used only with backward=True")
        return None
    if cand_graph is None:
        raise InputError("backward=True compares gradients node by node, and the candidate "
                         "could not be recorded (see the notes); diff it without backward")
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be a callable loss(outputs, inputs) -> scalar, got "
                         f"{type(loss).__name__}")
    from introspect.diff.backward import backward_diff

    return backward_diff(reference, candidate, ref_inputs, cand_inputs, alignment, ref_graph,
                         cand_graph, tolerance, loss=loss, noise_budget=noise_budget,
                         attention_mask=tensors.get("attention_mask"),
                         forward_status={r.reference_node: r.status for r in rows
                                         if r.reference_node and r.candidate_node},
                         allow_nonfinite=allow_nonfinite, reference_gradients=ref_gradients,
                         candidate_run=candidate_run, loss_inputs=loss_inputs)


def _one_forward_for_both(backward: bool, loss: Any, noise_budget: bool,
                          recordings: Any) -> Any:
    """``record_with_gradients`` where the backward diff can go on from the forward diff's
    recordings (not with a float64 reference, nor with recordings made already)."""
    if not backward or noise_budget or recordings is not None:
        return None
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be a callable loss(outputs, inputs) -> scalar, got "
                         f"{type(loss).__name__}")
    from introspect.diff.backward.record import record_with_gradients

    return record_with_gradients


def _gradients_now(reference: torch.nn.Module, ref_side: Any, loss: Any,
                   loss_inputs: Mapping[str, torch.Tensor]) -> Any:
    """The reference's backward, on the forward its recording ran; the recording lets go
    of it, and the backward of its values and autograd graph (memory: they would be held
    beside the candidate's whole run; the local backwards of a failing gradient run the
    reference's forward again, checked the same: ``backward.parity.reference_again``)."""
    from introspect.diff.backward.parity import backward_loss

    graph, accepted, recording = ref_side
    run, recording.run = recording.run, None
    _, loss_fn = backward_loss(reference, accepted, loss, loss_inputs)
    return run.backward(loss_fn, keep_values=False)


def _int8_outputs_note(verdict: Any) -> str:
    """Int8 Linears within their budget everywhere, the outputs beyond what they explain."""
    worst = max((r.max_abs_err or 0.0 for r in verdict.rows), default=0.0)
    return (f"every pair is within its budget (the int8 Linears within what int8 rounding "
            f"explains), yet the outputs move by up to {worst:.3g}, more than the reference "
            "run with the candidate's int8 Linears in place of its float ones reproduces: "
            "something outside the Linears differs (--atol widens the outputs' budget only)")


def _holds_script(model: torch.nn.Module) -> bool:
    """TorchScript keeps what an ``inference_mode`` call made (its profiled graph's
    tensors), and a later call with autograd on then fails: no such call for it."""
    return any(isinstance(m, torch.jit.ScriptModule) for m in model.modules())


def _compiled(model: torch.nn.Module) -> bool:
    """``torch.compile`` or TorchScript anywhere in ``model``: its compiler sees the truth
    calls' saved-tensor hooks (``run.truth``), so its calls keep what autograd saves."""
    return _holds_script(model) or any(getattr(m, "_orig_mod", None) is not None
                                       for m in model.modules())


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
    return (f"the {side} had {len(parts)} module(s) in training mode "
            f"({describe_changes(parts, most=3)}) inside a model "
            "in eval mode; diff ran them in eval mode (dropout off) and put them back")




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




def _measure_noise(reference: torch.nn.Module, candidate: torch.nn.Module,
                   tensors: Mapping[str, torch.Tensor]) -> tuple[torch.nn.Module, dict[str, float]]:
    """The reference in float64, and each of its nodes' noise in the candidate's dtype."""
    dtype = next((p.dtype for p in candidate.parameters() if p.is_floating_point()), torch.float32)
    exact = cast_copy(reference, torch.float64, what="noise_budget").eval()
    # on the candidate's device: its kernels (TF32, sdpa's flash) are the noise to measure
    where = devices.model_device(candidate)
    rounded = cast_copy(reference, dtype, what="noise_budget",
                        always=where != devices.model_device(reference)).to(where).eval()
    ref_graph, ref_inputs, _ = record_for_diff(
        exact, devices.to_device(tensors, devices.model_device(exact)), "float64")
    low_graph, low_inputs, _ = record_for_diff(rounded, devices.to_device(tensors, where),
                                               str(dtype))
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




# ---------------------------------------------------------------------------------------
# Tables


__all__ = ["DiffResult", "diff", "record_for_diff"]
