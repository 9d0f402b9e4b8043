"""The outputs' budget that a candidate's int8 Linears explain.

``quantize_dynamic`` moves a model's outputs far beyond float rounding (bert-tiny's by
~1e-2), so a correct int8 port fails the outputs' float budget. Widening that budget by
hand (``--atol``) proves nothing about what else moved them. Here the explanation is
proven instead: the reference is run again with the candidate's own int8 Linears in place
of the float Linears they were quantized from (every other module the reference's). When
that hybrid computes the candidate's outputs within float rounding, int8 accounts for the
whole difference; each int8 Linear is held to its own budget by the node-level pairs
(``quantized.int8_noise``). A fault outside the Linears (a tanh GELU, a bias shifted)
moves the candidate away from the hybrid, and the outputs fail as before.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from introspect.diff.outputs import TruthVerdict
from introspect.diff.quantized import is_quantized, quantized_word
from introspect.diff.records import STATUS_FAIL, STATUS_OK, OutputDiff, WeightRelation
from introspect.run.truth import Truth, run_truth


def with_int8_linears(reference: torch.nn.Module, candidate: torch.nn.Module,
                      relations: Sequence[WeightRelation]) -> tuple[torch.nn.Module, int] | None:
    """A copy of ``reference`` whose float Linears are replaced by copies of the candidate's
    int8 Linears quantized from them, and how many; None where one cannot stand in (a
    weight held transposed, a module that is not torch's own quantized Linear)."""
    swaps: dict[str, torch.nn.Module] = {}
    cand_modules = dict(candidate.named_modules())
    ref_modules = dict(reference.named_modules())
    for relation in relations:
        if not relation.kind.startswith("quantized"):
            continue
        if relation.kind not in ("quantized", "quantized float16") \
                or not relation.candidate.endswith(".weight") \
                or not relation.reference.endswith(".weight"):
            return None
        cand_module = cand_modules.get(relation.candidate.removesuffix(".weight"))
        ref_path = relation.reference.removesuffix(".weight")
        ref_module = ref_modules.get(ref_path)
        if cand_module is None or not _torch_int8_linear(cand_module) \
                or not isinstance(ref_module, torch.nn.Linear):
            return None
        swaps[ref_path] = cand_module
    if not swaps:
        return None
    hybrid = copy.deepcopy(reference)
    for path, module in swaps.items():
        parent_path, _, name = path.rpartition(".")
        parent = hybrid.get_submodule(parent_path) if parent_path else hybrid
        setattr(parent, name, copy.deepcopy(module))
    return hybrid.eval(), len(swaps)


def _torch_int8_linear(module: torch.nn.Module) -> bool:
    """torch's own int8 Linear, not a subclass a port wrote: its forward is the kernel's."""
    return type(module).__module__.startswith("torch.ao.nn.quantized") and is_quantized(module)


def explained_by_int8(verdict: TruthVerdict, reference: torch.nn.Module,
                      candidate: torch.nn.Module, candidate_truth: Truth,
                      relations: Sequence[WeightRelation], inputs: Mapping[str, torch.Tensor],
                      judge: Callable[[Truth, Truth], TruthVerdict],
                      labels: tuple[str, str]) -> TruthVerdict | None:
    """``verdict`` passed where the outputs' only failure is what the candidate's int8
    Linears explain; None where the hybrid cannot be built or does not explain it.

    ``judge(reference_truth, candidate_truth)`` compares two truths as the diff does.
    """
    if verdict.passed or verdict.reasons != ["outputs"]:
        return None
    built = with_int8_linears(reference, candidate, relations)
    if built is None:
        return None
    hybrid, swapped = built
    hybrid_truth = run_truth(hybrid, inputs)
    against_hybrid = judge(hybrid_truth, candidate_truth)
    if not against_hybrid.passed:
        return None
    rows = [_explained_row(row, against_hybrid.rows) for row in verdict.rows]
    if any(r.status == STATUS_FAIL for r in rows):
        return None
    moved = max((r.max_abs_err or 0.0 for r in verdict.rows), default=0.0)
    closest = max((r.max_abs_err or 0.0 for r in against_hybrid.rows), default=0.0)
    word = quantized_word(candidate)
    note = (f"{word} explains the outputs' error: the {labels[0]} run with the {labels[1]}'s "
            f"{swapped} {word} Linear(s) in place of its float ones computes the "
            f"{labels[1]}'s outputs within float rounding (max abs error {closest:.3g}); "
            f"{word} moves the outputs by up to {moved:.3g}, which is their budget here")
    return TruthVerdict(rows, [*verdict.notes, note], True, [])


def _explained_row(row: OutputDiff, against_hybrid: Sequence[OutputDiff]) -> OutputDiff:
    """The row against the reference, its limit raised by what int8 explains: passing where
    the same output agrees with the hybrid's."""
    twin = next((r for r in against_hybrid if r.reference_output == row.reference_output
                 and r.candidate_output == row.candidate_output and r.call == row.call), None)
    if twin is None or row.status != STATUS_FAIL:
        return row
    if twin.status != STATUS_OK:
        return dataclasses.replace(row, note=row.note or "beyond what int8 explains")
    limit = (row.max_abs_err or 0.0) if row.limit is None else \
        max(row.limit, row.max_abs_err or 0.0)
    return dataclasses.replace(row, limit=limit, status=STATUS_OK,
                               note="within what the int8 Linears explain")


__all__ = ["explained_by_int8", "with_int8_linears"]
