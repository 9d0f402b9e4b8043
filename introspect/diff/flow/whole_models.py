"""Both whole models in float64, in the flow: where some of the candidate's computation
is held by no module of its own that module evidence judged (a port written as plain
functions, a layer's feed-forward in a compiled method of the model), the outputs' loose
budget was all that judged it. With the outputs passing and every module within budget,
each model's own call is run again in float64 (``modules.precise``): the candidate's
outputs still apart from the reference's by more than the reference's own float32 error
explains fail it, as a row of the model itself."""

from __future__ import annotations

from introspect.diff.flow.state import DiffState, copies
from introspect.diff.modules.evidence import ModuleDiff, ModuleEvidence
from introspect.diff.modules.paths import within
from introspect.diff.modules.precise import whole_models_in_float64
from introspect.diff.ops.explain import accepted_inputs
from introspect.diff.records import STATUS_FAIL, STATUS_OK
from introspect.run.truth import NO_GRAD


def judge_whole_models(state: DiffState) -> None:
    """A failing row for the model itself, where its float64 run fails (see the module's
    docstring); nothing otherwise. Right after module evidence is gathered."""
    evidence, verdict = state.module_evidence, state.verdict
    if verdict is None or not verdict.passed or evidence is None or not evidence.passed \
            or state.ref_truth is None or not state.ref_truth.calls \
            or not computed_outside_modules(evidence):
        return
    names = sorted({(r.reference_output, r.candidate_output) for r in verdict.rows
                    if r.candidate_output})
    found = whole_models_in_float64(
        state.reference, state.candidate, copies(state.ref_accepted),
        accepted_inputs(state.candidate, state.cand_tensors),
        state.ref_truth.calls[0].outputs, names, state.tensors.get("attention_mask"))
    if found is None or not found.check.failed:
        return
    check = found.check
    evidence.rows.append(ModuleDiff(
        "", type(state.candidate).__name__, "", "outputs", NO_GRAD, "value", check.error,
        None, check.limit, STATUS_FAIL, f"{check.why} (at {found.reference_output})"))


def computed_outside_modules(evidence: ModuleEvidence) -> bool:
    """Some weight of the candidate sits in no module of its that module evidence judged
    within budget (its module was never called, holds the model's whole computation, or
    holds every weight in one flat Parameter)."""
    judged = [r.candidate_module for r in evidence.rows
              if r.status == STATUS_OK and r.candidate_module]
    return any(not any(within(name.rpartition(".")[0], m) for m in judged)
               for name in evidence.relations)


__all__ = ["computed_outside_modules", "judge_whole_models"]
