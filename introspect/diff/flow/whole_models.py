"""Both whole models in float64, in the flow: where some of the candidate's computation
is held by no module of its own that module evidence judged (a port written as plain
functions, a layer's feed-forward in a compiled method of the model), the outputs' loose
budget was all that judged it. With the outputs passing and every module within budget,
each model's own call is run again in float64 (``modules.precise``): the candidate's
outputs still apart from the reference's by more than the reference's own float32 error
explains fail it, as a row of the model itself."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from introspect.diff.flow.state import DiffState, copies
from introspect.diff.modules.blocks import block_layers
from introspect.diff.modules.departure import Departure, first_departure
from introspect.diff.modules.evidence import ModuleDiff, ModuleEvidence, ReferenceLayers
from introspect.diff.modules.paths import within
from introspect.diff.modules.precise import whole_models_in_float64
from introspect.diff.ops.explain import accepted_inputs, model_dtypes
from introspect.diff.records import STATUS_FAIL, STATUS_OK
from introspect.run.truth import NO_GRAD


def judge_whole_models(state: DiffState, glue: Sequence[str] = ()) -> None:
    """A failing row for the model itself, where its float64 run fails (see the module's
    docstring); nothing otherwise. Right after module evidence is gathered. ``glue``: the
    values code no module evidence judged computed and handed on
    (``accounted.computed_by_glue``: a layer's output scaled in the model's own loop, a
    hook on the model adding a constant), which only the whole models judge too."""
    evidence, verdict = state.module_evidence, state.verdict
    if verdict is None or not verdict.passed or evidence is None or not evidence.passed \
            or state.divergence is not None or state.ref_truth is None \
            or not state.ref_truth.calls \
            or not (glue or computed_outside_modules(evidence)) \
            or _coarser_than_float32(state) or state.changes_between_calls():
        return
    names = sorted({(r.reference_output, r.candidate_output) for r in verdict.rows
                    if r.candidate_output})
    found = whole_models_in_float64(
        state.reference, state.candidate, copies(state.ref_accepted),
        accepted_inputs(state.candidate, state.cand_tensors),
        state.ref_truth.calls[0].outputs, _candidate_outputs(state), names,
        state.tensors.get("attention_mask"))
    if found is None or not found.check.failed:
        return
    check = found.check
    # named where the two float64 runs part (``modules.departure``); where every weight
    # no judged module holds is one reference module's (a layer's output LayerNorm the
    # model computes by hand in NumPy) and it lies in that layer, that module, finer
    layers = ReferenceLayers.of(state.reference)
    module, where = "", ""
    departure = _departure(state)
    if departure is not None:
        module, where = departure.module, f"; {departure.why}"
    unjudged = _unjudged_module(evidence)
    if unjudged and (departure is None or layers.of_module(unjudged) == departure.layer):
        module = unjudged
        where += f"; every weight no judged module holds is {unjudged}'s"
    if glue and not computed_outside_modules(evidence):
        # (an attention mask its own code made is the likeliest glue, and the least telling)
        told = sorted(glue, key=lambda reason: "mask" in reason)
        where += f"; {'; '.join(told[:2])}{'; ...' if len(told) > 2 else ''}"
    layer = layers.of_module(module)
    error, limit = check.shown  # (the mean gap and its budget, where it failed on those)
    evidence.rows.append(ModuleDiff(
        "", type(state.candidate).__name__, module, layer, NO_GRAD, "value", error,
        None, limit, STATUS_FAIL,
        f"{check.why} (at {found.reference_output}{where})"))


def name_where_runs_part(state: DiffState) -> None:
    """A forward FAIL that names no layer, only the outputs (the recording could not see
    the candidate's run: a ``torch.jit.trace`` program, a port as functions with a blind
    region), or a block after blocks of which no op was paired (``_blind_before``), named
    where the two models' float64 runs part (``modules.departure``), the divergence's
    figures left as they are. Last in the flow; nothing where no layer's gap
    grows, where a side rounds coarser than float32 or the candidate changes between
    calls."""
    divergence = state.divergence
    if state.passed or divergence is None or divergence.phase != "forward" \
            or divergence.step is not None or state.ref_truth is None \
            or _coarser_than_float32(state) or state.changes_between_calls():
        return
    blind = _blind_before(state, divergence.layer)
    if divergence.layer != "outputs" and not blind:
        return
    departure = _departure(state)
    if departure is not None and (divergence.layer == "outputs"
                                  or departure.layer in blind):
        held = (f"the pair at {divergence.reference_node} ran on the reference's values "
                f"from before {blind[0]}, of which no op was paired: its local error holds "
                f"what {blind[0]} to {blind[-1]} computed", ) if blind else ()
        state.divergence = dataclasses.replace(
            divergence, module=departure.module, layer=departure.layer,
            hints=(*divergence.hints, *held, departure.why))


def _blind_before(state: DiffState, layer: str) -> list[str]:
    """The reference's blocks before ``layer`` (itself included) where no op-level pair
    was made, where every block before it has none: the pair that failed there was run on
    the reference's values from before them all, so its local error holds whatever those
    blocks computed (a port padding its sequence pairs nothing but its cut output, and a
    tanh GELU in layer 3 was named in layer 5). [] where some block before it was paired,
    or ``layer`` is no block."""
    blocks = list(dict.fromkeys(block_layers(state.reference).values()))
    if layer not in blocks or state.inside:  # (recorded inside one module by design)
        return []
    paired = {row.layer for row in state.rows if row.reference_node and row.candidate_node}
    before = blocks[:blocks.index(layer) + 1]
    if any(block in paired for block in before[:-1]) or len(before) < 2:
        return []
    return before


def _departure(state: DiffState) -> Departure | None:
    """Where the two models' float64 runs part, on each side's accepted inputs."""
    return first_departure(state.reference, state.candidate, copies(state.ref_accepted),
                           accepted_inputs(state.candidate, state.cand_tensors),
                           state.tensors.get("attention_mask"))


def _unjudged_module(evidence: ModuleEvidence) -> str:
    """The one reference module owning every reference weight held by the candidate's
    weights no module judged (``computed_outside_modules``); "" where they are several
    modules' (a port written as functions) or none."""
    owners = {reference.rpartition(".")[0] for name in _unjudged_weights(evidence)
              for reference in evidence.relations[name]}
    return owners.pop() if len(owners) == 1 else ""


def _candidate_outputs(state: DiffState) -> dict[str, torch.Tensor]:
    """The candidate's own float32 outputs, from its plain call under ``no_grad`` (the
    float64 run's mode): what an island's own float32 error is measured from."""
    truth = state.cand_truth
    return (truth.outputs_of(NO_GRAD) if truth is not None else None) or {}


def _coarser_than_float32(state: DiffState) -> bool:
    """A side that rounds coarser than float32 by design (bfloat16 or float16 weights,
    int8 Linears, TF32 matmuls): its outputs' budget is that rounding's, not the
    reference's float32 error."""
    dtypes = model_dtypes(state.reference) | set(state.candidate_dtypes)  # (qint8: int8)
    return bool(dtypes - {"float32", "float64"}) or bool(state.device_rounding)


def computed_outside_modules(evidence: ModuleEvidence) -> bool:
    """Some weight of the candidate is read by code no module evidence judged: its module
    was never called (a layer's feed-forward in a method of the model, a dict of weights,
    a flat Parameter) or is the model itself, and no module judged within budget holds
    it (the model's own call, judged where it took floating inputs, holds every one). (A
    module called on integers alone, an embedding, is not judged either; what it returns
    is held by the modules it hands it to.)"""
    return bool(_unjudged_weights(evidence))


def _unjudged_weights(evidence: ModuleEvidence) -> list[str]:
    """The candidate's weights read by code no module evidence judged (see
    ``computed_outside_modules``)."""
    judged = [r.candidate_module for r in evidence.rows if r.status == STATUS_OK]
    found = []
    for name in evidence.relations:
        owner = name.rpartition(".")[0]
        if (owner == "" or owner not in evidence.called) \
                and not any(within(owner, m) for m in judged):
            found.append(name)
    return found


__all__ = ["computed_outside_modules", "judge_whole_models", "name_where_runs_part"]
