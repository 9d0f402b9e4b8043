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
from typing import Any

import torch

from introspect.diff.modules.local import Exact
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.modules.paths import within
from introspect.diff.modules.precise import Float64Check, ReferenceCalls, float64_check
from introspect.diff.records import STATUS_UNCONFIRMED

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


__all__ = ["CANCELLED", "CANCEL_UNITS", "cancelled", "cancelled_modules", "cancelled_notes",
           "cancelling_gap", "is_cancelled", "same_in_float64", "within_cancelled"]
