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

from collections.abc import Mapping
from typing import Any

import torch

from introspect.diff.flow.candidate import build_candidate, judge_outputs, take_candidate_truth
from introspect.diff.flow.finish import check_inputs_unchanged, diff_result
from introspect.diff.flow.gradients import compare_gradients
from introspect.diff.flow.handoff import check_modes, diff_generation_mode, diff_parallel_mode
from introspect.diff.flow.inside import explain_inside_failing
from introspect.diff.flow.module_evidence import join_module_evidence, pass_without_recording
from introspect.diff.flow.op_level import (
    explain_int8_outputs,
    explain_ops,
    hold_recordings_to_truth,
    settle_verdict,
)
from introspect.diff.flow.other_modes import explain_other_modes
from introspect.diff.flow.reference import (
    measure_noise_budget,
    place_models,
    record_reference_clean,
    record_reference_late,
    reference_again_where_moved,
    take_reference_truth,
)
from introspect.diff.flow.state import DiffState
from introspect.diff.ops.eager import Recording
from introspect.diff.ops.explain import record_for_diff
from introspect.diff.options import Budgets, Devices, DiffOptions, Mode, Tables
from introspect.diff.result import DiffResult
from introspect.models.load import TokenizedInputs
from introspect.tracing.tracer import holds_trace_lock


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
            With ``generate``, the reference cast to the candidate's dtype decodes beside
            it with its own cache, and every step's logits, caches and nodes are held to
            at least ``noise_factor`` times how far its values are from the reference's.
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
    options = DiffOptions(
        Budgets(atol=atol, rtol=rtol, noise_budget=noise_budget, noise_factor=noise_factor,
                allow_nonfinite=allow_nonfinite),
        Mode(generate=generate, tokenizer=tokenizer, backward=backward, loss=loss,
             forward_keywords=forward_keywords, recordings=recordings, nproc=nproc),
        Devices(device=device, candidate_device=candidate_device),
        Tables(nodes=nodes, name_map=name_map, reference_label=reference_label,
               candidate_label=candidate_label))
    if nproc is not None:  # a tensor-parallel port: its own mode
        return diff_parallel_mode(reference, candidate, inputs, options)
    check_modes(options)
    if generate:
        return diff_generation_mode(reference, candidate, inputs, options, diff_forward=diff)
    state = DiffState.start(reference, candidate, inputs, options)
    try:
        place_models(state)
        take_reference_truth(state)  # the reference first, clean: before the candidate is built
        record_reference_clean(state)
        build_candidate(state)
        if noise_budget:
            measure_noise_budget(state)
        if state.truths:
            take_candidate_truth(state)
            judge_outputs(state)
        pass_without_recording(state)
        if state.fast is None:  # the op-level recording explains
            if not explain_inside_failing(state):  # inside the failing module, or all
                record_reference_late(state)
                explain_ops(state)
                hold_recordings_to_truth(state)
                explain_other_modes(state)
                explain_int8_outputs(state)
                compare_gradients(state)
                settle_verdict(state)
            join_module_evidence(state)
            # the reference once more (or its footprint): what the candidate left behind
            if state.ref_truth is not None:
                reference_again_where_moved(state)
    finally:  # every module back in its own mode and on its own device
        state.put_back()
    check_inputs_unchanged(state, inputs)
    return diff_result(state)


__all__ = ["DiffResult", "diff", "record_for_diff"]
