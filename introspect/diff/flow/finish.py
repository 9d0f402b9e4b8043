"""The last steps, once every model is put back: the caller's inputs proven untouched, and
the ``DiffResult`` built from what the steps found."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from introspect.diff.flow.state import DiffState, tensors_of
from introspect.diff.modules.tables import modules_only
from introspect.diff.result import DiffResult, backward_divergence
from introspect.diff.tables import layer_rows
from introspect.errors import InputError
from introspect.models.load import TokenizedInputs
from introspect.run.truth import identical


def check_inputs_unchanged(state: DiffState,
                           inputs: TokenizedInputs | Mapping[str, torch.Tensor]) -> None:
    """The caller's inputs as they were handed over (each model only ever got a copy)."""
    changed = [name for name, tensor in tensors_of(inputs).items()
               if not identical(tensor, state.tensors[name])]
    if changed:  # never: every model got a copy; a guard on that promise
        raise InputError(f"the inputs {', '.join(changed)} changed during the diff")


def diff_result(state: DiffState) -> DiffResult:
    """The ``DiffResult``: a PASS without recording has no node rows; otherwise the node
    rows, their layers, and the divergence (the backward's first where the forward has
    none)."""
    tolerance, notes = state.tolerance, state.notes
    noise_budget = state.options.budgets.noise_budget
    verdict, fast = state.verdict, state.fast
    if fast is not None:  # a PASS the outputs and module evidence prove: no node rows
        assert verdict is not None
        return DiffResult(True, None, [], fast.layers, fast.alignment, None, None, tolerance,
                          notes, state.reference_label, state.candidate_label, noise_budget,
                          output_rows=verdict.rows, module_evidence=state.module_evidence,
                          op_level=False, backward=state.gradients)
    ref_side, explanation, gradients = state.ref_side, state.explanation, state.gradients
    assert ref_side is not None
    # op evidence inside one module only: the layers module evidence judged stand for all
    layers = modules_only(state.module_evidence).layers if state.inside \
        else layer_rows(state.rows, ref_side[0].records)
    passed = state.passed and (gradients is None or gradients.passed)
    divergence = state.divergence
    if divergence is None and gradients is not None and gradients.first_divergence is not None:
        divergence = backward_divergence(gradients.first_divergence)  # what decided
    return DiffResult(passed, divergence, state.rows, layers, explanation.alignment,
                      ref_side[0], explanation.graph, tolerance, notes, state.reference_label,
                      state.candidate_label, noise_budget, backward=gradients,
                      output_rows=verdict.rows if verdict is not None else [],
                      replay=explanation.replay, histograms=explanation.histograms,
                      module_evidence=state.module_evidence, inside=state.inside)


__all__ = ["check_inputs_unchanged", "diff_result"]
