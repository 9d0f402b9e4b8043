"""A module's difference that the module holding it cancels exactly: no FAIL.

A port may compute a submodule's value otherwise than the reference where the module
holding it cannot tell the two apart. A key projection without its bias is one: the bias
adds ``q · b`` to every score of a query's row, and the softmax over the keys takes that
constant away, so the attention returns the same values. The key Linear is then over its
budget (it is not the reference's key), yet what it feeds is the reference's.

Such a difference is told from a fault that the holder's budget merely hides (a tanh GELU
inside a layer moves the layer by a fraction of its budget, and must fail) by running the
holder again in float64, on the reference's inputs, as ``precise`` does. A fault survives
there: its share of the holder's output stays (a tanh GELU's, about 1e-4 of it). A
difference that cancels leaves nothing but float64 rounding: a gap within
``CANCEL_UNITS`` float64 roundings of the holder's output. Only then is the row inside
unconfirmed, with a note naming its holder and the gap; a holder that rounds in float32
anywhere in its float64 run (an island) proves nothing, and the row fails as before. So
does a row whose own module, run alone in float64, differs from its reference by another
amount than in float32 (``same_in_float64``): its float64 run is not what it computed in
float32 (an adversary's branch on the dtype), and cannot vouch for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch

from introspect.diff.modules.local import Exact, exact_error
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.modules.paths import depth, within
from introspect.diff.modules.precise import (
    Float64Check,
    ReferenceCalls,
    float64_check,
    on_reference_inputs,
    run_in_float64,
)
from introspect.diff.modules.same_program import same_program
from introspect.diff.records import STATUS_FAIL, STATUS_OK, STATUS_UNCONFIRMED

# Float64 roundings of the holder's largest magnitude within which its run is the
# reference's exactly: 2^16 of them, about 1.5e-11 of it. A float64 run of a correct
# module regrouped is within a few hundred; the smallest fault measured (an output scaled
# by 1 + 1e-7) is 7e-8 of it.
CANCEL_UNITS = 2.0 ** 16
CANCELLED = "cancelled where it is held"  # a cancelled row's note begins so


def cancelling_gap(holder: ModulePair, exact: Exact, references: ReferenceCalls) -> float | None:
    """The float64 gap between ``holder``'s candidate and its reference, both run on the
    reference's inputs, where it is within ``CANCEL_UNITS`` roundings of the reference's
    largest magnitude (``exact``: its local run's); None where it is not, or where the
    float64 run proves nothing."""
    check = _in_float64(holder, exact, references)
    if check is None or check.error > CANCEL_UNITS * torch.finfo(torch.float64).eps * exact.scale:
        return None
    return check.error


def runs_alike(pair: ModulePair) -> bool:
    """Whether ``pair``'s candidate, on the reference's inputs, runs the same program in
    float32 as in float64 (``same_program``): only then does its float64 run vouch for
    what its float32 ops inside it differ by (a node of the op level, no module of its
    own, which ``same_in_float64`` cannot run alone)."""
    call = pair.call
    args, kwargs = on_reference_inputs(pair)
    return same_program(call.module, args, kwargs, call.grad,
                        lambda run, given: run_in_float64(call.module, given, call.grad, run))


def same_in_float64(pair: ModulePair, exact: Exact, budget: float,
                    references: ReferenceCalls) -> bool:
    """Whether the failing ``pair``'s candidate differs from its reference in float64 as
    in float32: its largest gap there within ``budget`` (its float32 budget) of the one
    its float32 run measured (``exact``). A module whose float64 run is not its float32
    one (a branch on ``x.dtype``, right in float64 only) cannot show by its holder's
    float64 run that what it differs by in float32 cancels."""
    check = _in_float64(pair, exact, references)
    return check is not None and abs(check.error - exact.error) <= budget


def _in_float64(pair: ModulePair, exact: Exact, references: ReferenceCalls,
                ) -> Float64Check | None:
    """``pair`` run again in float64 on the reference's inputs, over the elements its
    local run compared (``exact``); None where that proves nothing here: no reference
    call computes it, or the candidate's run rounds in float32 somewhere (an island)."""
    reference = references.computing(pair)
    if reference is None:
        return None
    check = float64_check(pair, reference, exact.keep, exact.scale)
    return None if check is None or check.island else check


@dataclasses.dataclass(frozen=True)
class Holder:
    """A passing module (its ``evidence.ModuleDiff`` row) whose candidate, run on the
    reference's inputs in float64, is the reference's to ``gap``, and runs the same
    program in float32: what a node inside it differs by cancels there."""

    row: Any
    gap: float


def cancelling_holders(failing: Iterable[tuple[str, str]], evidence: Any,
                       references: ReferenceCalls, real: torch.Tensor | None,
                       blind: Collection[str] = ()) -> dict[tuple[str, str], Holder]:
    """For each (candidate module, reference module) of ``failing`` (where an op-level row
    fails: its candidate node's module, its reference node's), the smallest module
    ``evidence`` passed holding both that cancels what they differ by: the candidate's
    module holds the candidate node, and the reference's weights it holds are of a module
    holding the reference node (``ModulePair.region``: a row pairing a node inside with a
    value outside, a pooler's Linear with the reference's tanh after it, is no difference
    it could cancel); run in float64 on the reference's inputs, it is the reference's
    exactly (``cancelling_gap``), running the same program as in float32 (``runs_alike``).
    A module with a failing row inside, or a region the recording could not see
    (``blind``), holds none. ``real``: the attention mask (padding is not compared).
    Needs the evidence's pairs (``keep_calls``)."""
    pairs: dict[str, ModulePair] = {}
    for pair in evidence.pairs:  # (its first call: with autograd on, where judged so)
        pairs.setdefault(pair.call.name, pair)
    failed = [r.candidate_module for r in evidence.rows if r.status == STATUS_FAIL]
    passing = {r.candidate_module: r for r in evidence.rows
               if r.status == STATUS_OK and r.candidate_module and pairs.get(
                   r.candidate_module) is not None and pairs[r.candidate_module].region}
    tried: dict[str, float | None] = {}
    found: dict[tuple[str, str], Holder] = {}
    for candidate, reference in dict.fromkeys(failing):
        around = [h for h in passing
                  if within(candidate, h) and within(reference, pairs[h].region)]
        for holder in sorted(around, key=depth, reverse=True):
            if any(within(f, holder) for f in failed) \
                    or any(within(b, holder) or within(holder, b) for b in blind):
                continue
            if holder not in tried:
                tried[holder] = _gap_where_alike(pairs[holder], references, real)
            gap = tried[holder]
            if gap is not None:
                found[(candidate, reference)] = Holder(passing[holder], gap)
                break
    return found


def _gap_where_alike(pair: ModulePair, references: ReferenceCalls,
                     real: torch.Tensor | None) -> float | None:
    try:
        exact = exact_error(pair, real)
    except Exception:  # noqa: BLE001  a run that raises proves nothing
        return None
    gap = cancelling_gap(pair, exact, references)
    return gap if gap is not None and runs_alike(pair) else None


def cancelled_nodes_note(holders: Mapping[tuple[str, str], Holder], rows: int) -> str:
    """The verdict's note on ``rows`` op-level rows unconfirmed inside ``holders``."""
    named = list(dict.fromkeys(h.row.candidate_module for h in holders.values()))
    worst = max(h.gap for h in holders.values())
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    return (f"{rows} node(s) over budget inside {', '.join(named[:3])}{more}, which, run on "
            f"the reference's inputs in float64, returned the reference's values to "
            f"{worst:.2g} (float64 rounding), running the same ops as in float32: what the "
            "nodes differ by cancels there (e.g. a key's bias, which the softmax ignores); "
            "they are unconfirmed")


def cancelled(row: Any, holder: Any, gap: float) -> Any:
    """``row`` (an ``evidence.ModuleDiff``) unconfirmed: ``holder``, the row of the module
    holding it, is the reference's exactly."""
    return dataclasses.replace(
        row, status=STATUS_UNCONFIRMED,
        note=f"{CANCELLED}: {holder.candidate_module or 'the model'}, which holds it, run "
             f"on the reference's inputs in float64 is the reference's "
             f"{holder.reference_module or 'model'} to {gap:.2g} (float64 rounding): what "
             "this module differs by cancels there (e.g. a key's bias, which the softmax "
             "ignores)")


def is_cancelled(row: Any) -> bool:
    """A module row unconfirmed by ``cancelled``."""
    return row.status == STATUS_UNCONFIRMED and row.note.startswith(CANCELLED)


def cancelled_modules(evidence: Any) -> set[str]:
    """The candidate's modules (named; not the model itself) whose rows of ``evidence``
    (a ``ModuleEvidence``) ``cancelled`` unconfirmed."""
    return {r.candidate_module for r in evidence.rows if is_cancelled(r) and r.candidate_module}


def cancelled_notes(evidence: Any) -> list[str]:
    """The verdict's note on the rows of ``evidence`` (a ``ModuleEvidence``) that
    ``cancelled`` unconfirmed ([]: none)."""
    rows = [r for r in evidence.rows if is_cancelled(r)]
    if not rows:
        return []
    named = ", ".join(dict.fromkeys(r.candidate_module for r in rows[:3]))
    more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
    return [f"{len(rows)} module call(s) differ from the reference's ({named}{more}) where "
            "the module holding each is the reference's exactly (run in float64 on its "
            "inputs): what they differ by cancels there and fails nothing (the modules' "
            "rows say where)"]


def within_cancelled(weight: str, evidence: Any) -> bool:
    """Candidate weight ``weight`` (its path) belongs to a module ``cancelled`` unconfirmed
    (or a module inside one): whatever it holds cancels in the module holding that one."""
    module = weight.rpartition(".")[0]
    return any(within(module, cancelled) for cancelled in cancelled_modules(evidence))


__all__ = ["CANCELLED", "CANCEL_UNITS", "Holder", "cancelled", "cancelled_modules",
           "cancelled_nodes_note", "cancelled_notes", "cancelling_gap", "cancelling_holders",
           "is_cancelled", "runs_alike", "same_in_float64", "within_cancelled"]
