"""Op evidence only inside the failing module, in the flow: where no node tables are asked
for and module evidence fails, the smallest failing module is recorded and replayed alone
(``ops.inside``), not both whole models; its first divergence and hints name the op."""

from __future__ import annotations

import dataclasses
import functools

from introspect.diff.flow.state import DiffState, copies
from introspect.diff.modules.cancelled import cancelled_modules
from introspect.diff.modules.evidence import ReferenceLayers
from introspect.diff.modules.failing import pair_of
from introspect.diff.modules.paths import within
from introspect.diff.ops.explain import Alone, explain
from introspect.diff.ops.inside import explain_scope, scope_of
from introspect.diff.records import STATUS_FAIL, Divergence, NodeDiff


def explain_inside_failing(state: DiffState) -> bool:
    """The op-level explanation inside the smallest failing module, in place of the full
    one (False: not taken; the full path runs). After module evidence was judged before
    any recording (``state.early``) and failed, while the calls' values are still held;
    they are let go here, whether it is taken or not."""
    if not state.early or state.module_evidence.passed:
        return False  # (judged after the recording: its values wait for it)
    # (with backward, every node's gradient is compared on both whole recordings)
    taken = not state.options.mode.backward and _explain_inside(state)
    state.ref_calls.calls.clear()  # the values are let go: memory
    state.cand_calls.calls.clear()
    return taken


def _explain_inside(state: DiffState) -> bool:
    row = state.module_evidence.smallest_failing()[0]
    module = row.candidate_module
    blind = [name for name in state.unseen if within(name, module) or within(module, name)]
    if blind:  # what the recording cannot see: the full path says so, region by region
        return False
    found = pair_of(row, state.ref_calls, state.cand_calls, state.module_evidence.relations)
    scope = scope_of(*found) if found is not None else None
    if scope is None:
        return False
    explain_with = functools.partial(
        explain, candidate_label=state.candidate_label, cand_keywords=None,
        tolerance=state.tolerance, noise=None, candidate_dtypes=state.candidate_dtypes,
        name_map=None, allow_nonfinite=state.options.budgets.allow_nonfinite,
        forward_keywords=None, noise_budget=False, reference=state.reference,
        raise_errors=False, placement=state.placement,
        original_reference=state.original_reference, repeatable=state.candidate_repeatable(),
        alone=Alone(state.tensors.get("attention_mask"),
                    {"reference_model": state.reference, "candidate_model": state.candidate,
                     "inputs": copies(state.ref_accepted),  # (the hints run either model)
                     "scope": scope.module if scope.computed_alone else ""}))
    explained = explain_scope(scope, explain_with, state.reference_label)
    if explained is None:
        return False
    ref_side, explanation = explained
    layers = ReferenceLayers.of(state.reference)
    confirm = explanation.confirm_inside

    # (a guess inside a failing module, named as here)
    def confirm_inside(modules, passing=(), cancelled=(), cancelled_rows=()):
        rows, divergence = confirm(modules, passing, cancelled, cancelled_rows)
        return ([_relabelled(r, layers) for r in rows],
                _named(divergence, layers, scope.candidate_module))

    if confirm is not None:
        explanation = dataclasses.replace(explanation, confirm_inside=confirm_inside)
    state.ref_side, state.explanation, state.inside = ref_side, explanation, scope.module
    cancelled = cancelled_modules(state.module_evidence)
    if cancelled and confirm is not None:  # (a node inside one fails nothing)
        state.rows, state.divergence = confirm_inside(set(), (), cancelled)
    else:
        state.rows = [_relabelled(r, layers) for r in explanation.rows]
        state.divergence = _named(explanation.divergence, layers, scope.candidate_module)
    state.notes += explanation.notes
    state.notes.append(
        f"op-level evidence only inside {scope.module} (the candidate's "
        f"{scope.candidate_module}), the smallest module over its budget, each side recorded "
        "alone on the values module evidence judged it on; for every node pass nodes=True "
        "(introspect diff: --out or --nodes)")
    state.explained_passed = state.divergence is None \
        and not any(r.status == STATUS_FAIL for r in state.rows)
    verdict = state.verdict
    state.passed = verdict.passed and state.explained_passed if verdict is not None \
        else state.explained_passed
    state.random = bool(state.cand_truth is not None
                        and state.cand_truth.changed_between_calls())
    return True


def _relabelled(row: NodeDiff, layers: ReferenceLayers) -> NodeDiff:
    """A row laid in the reference's own layer (a module held alone has no backbone to
    label it by)."""
    if not row.module or row.layer in ("inputs", "outputs"):
        return row
    return dataclasses.replace(row, layer=layers.of_module(row.module))


def _named(divergence: Divergence | None, layers: ReferenceLayers,
           candidate_module: str) -> Divergence | None:
    """The divergence inside the scope in the reference's layer; none at its inputs (the
    reference's values, or the call's own: no op of the module's)."""
    if divergence is not None and divergence.layer == "inputs":
        return None
    if divergence is None or not divergence.module or divergence.layer == "outputs":
        return divergence
    return dataclasses.replace(divergence, layer=layers.of_module(divergence.module),
                               candidate_module=divergence.candidate_module
                               or candidate_module)


__all__ = ["explain_inside_failing"]
