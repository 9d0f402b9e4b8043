"""Whether module evidence accounts for everything a candidate's plain call computed.

A PASS may rest on the outputs and module evidence alone, with no op-level recording
(issue 41, part 6), only where every value the call computed is either inside a module
whose evidence was taken and is within budget (its local error covers all it computes,
the code between its submodules included), or proven equal, bit for bit, to a value that
such a module returned or that the reference itself computed. The code that module
evidence does not judge is the *glue*: the forwards of modules with no row (a model whose
inputs are token ids, an embeddings block that sums its lookups) between the judged ones.

The rule, on the first plain call with autograd on (``capture``):

- *judged*: a module call whose row is "ok" (compared, within its budget);
- *outermost judged*: a judged call inside no other judged call (nesting by the order
  calls started and finished, not by names);
- every floating input of an outermost judged call, and every floating output of the
  model's own call where that call is not judged, must be identical to the output that
  some judged call's row compared, to a value the reference's modules took or returned,
  or to one of the model's own floating inputs, or be a view of one (``x[:, 0]``: its
  elements, unchanged since; the judged module that takes it was paired with the
  reference's value near it, ``pairing.INPUT_NEAR``). A value computed by glue, scaled
  or summed in another order, is none of these; the full path then runs.
- the ``no_grad`` call must make the same module calls on the same values (then the
  autograd call's evidence stands for it), and no region may be one the recording could
  not see (``evidence.Uncovered``).

What glue computed (``computed_by_glue``: a layer's output scaled in the model's own
loop, a hook on the model adding a constant to its output) is also judged by both whole
models run again in float64 (``flow.whole_models``), on a PASS with the recording as
without it.

What the rule does not see: a non-floating value glue makes (token positions, a boolean
mask) is used as it is when a judged module runs again on the reference's inputs, so a
wrong one shows in that module's local error or in the outputs; it is not proven equal.

Example::

    >>> unaccounted(ref_calls, cand_calls, evidence.rows)
    []
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import torch

from introspect.diff.modules.evidence import ModuleDiff
from introspect.diff.records import STATUS_OK
from introspect.run.capture import Calls, Leaf, ModuleCall, probe
from introspect.run.truth import AUTOGRAD, NO_GRAD, identical

_PROBE = 64  # elements read to key a value; equality is checked in full on a hit


def unaccounted(reference: Calls, candidate: Calls, rows: Sequence[ModuleDiff]) -> list[str]:
    """What module evidence leaves unproven in ``candidate``'s plain call, in words ([]:
    nothing, and a PASS may rest on the outputs and these rows)."""
    calls = sorted(candidate.of_mode(AUTOGRAD), key=lambda c: c.order)
    root = [c for c in calls if c.name == ""]
    if not calls or len(root) != 1:
        return ["the model's own call was not seen once with autograd on"]
    if any(r.call != AUTOGRAD for r in rows):
        return ["its no_grad call computed other values than its autograd call"]
    if not _replayed(calls, sorted(candidate.of_mode(NO_GRAD), key=lambda c: c.order)):
        return ["its no_grad call made other module calls, or on other values"]
    if any(c.thread or c.edited_inputs or c.started < 0 for c in calls):
        return ["a module call in a worker thread, or one that edited its inputs"]
    return computed_by_glue(reference, candidate, rows)


def computed_by_glue(reference: Calls, candidate: Calls,
                     rows: Sequence[ModuleDiff]) -> list[str]:
    """The values (in words) that code no module evidence judged computed and handed on:
    a floating input of an outermost judged call, or a floating output of the model, that
    is none of the values glue may hand on as they are (``_sources``): a layer's output
    scaled in the model's own loop, a hook on the model adding a constant ([]: none, or
    the model's own call was not seen once with autograd on)."""
    calls = sorted(candidate.of_mode(AUTOGRAD), key=lambda c: c.order)
    root = [c for c in calls if c.name == ""]
    if len(root) != 1:
        return []
    judged = _judged(calls, rows)
    sources = _sources(reference, judged, root[0])
    reasons = []
    outermost = _outermost(judged)
    for call in judged:
        if id(call) not in outermost:
            continue  # inside a judged call: its inputs are that call's own business
        for leaf in call.inputs:
            if not leaf.unchanged() or not sources.holds(leaf.value):
                reasons.append(f"{call.name or 'the model'} takes {leaf.path} from code no "
                               "module evidence judged")
    if root[0] not in judged:
        reasons += [f"the model returns {leaf.path.removeprefix('output.')} from code no "
                    "module evidence judged" for leaf in root[0].outputs
                    if not leaf.unchanged() or not sources.holds(leaf.value)]
    return reasons


def _sources(reference: Calls, judged: Sequence[ModuleCall], root: ModuleCall) -> _Values:
    """The values glue may hand on as they are: what a judged call's row compared, what
    the reference's modules took or returned, the model's own inputs."""
    sources = _Values()
    for call in judged:
        kept = [leaf for leaf in call.outputs if leaf.unchanged()]
        sources.add(kept[:1])  # the output its row compared
    for call in reference.of_mode(AUTOGRAD):
        sources.add(leaf for leaf in call.inputs + call.outputs if leaf.unchanged())
    sources.add(root.inputs)
    return sources


def _judged(calls: Sequence[ModuleCall], rows: Sequence[ModuleDiff]) -> list[ModuleCall]:
    """The calls whose rows are within budget: a module counts only where every one of its
    autograd calls has such a row (rows do not say which call of a module they judged)."""
    ok: dict[str, int] = {}
    for r in rows:
        if r.status == STATUS_OK and r.max_abs_err is not None:
            ok[r.candidate_module] = ok.get(r.candidate_module, 0) + 1
    made: dict[str, int] = {}
    for c in calls:
        made[c.name] = made.get(c.name, 0) + 1
    return [c for c in calls if ok.get(c.name, 0) == made[c.name]]


def _inside(call: ModuleCall, other: ModuleCall) -> bool:
    """``call`` ran within ``other``'s call (started after it, finished before it)."""
    return other is not call and other.started < call.started and call.order < other.order


def _outermost(calls: Sequence[ModuleCall]) -> set[int]:
    """The ids of ``calls`` that ran inside none of the others (``_inside``): each call
    against the latest finish of those started before it, in one pass over the calls by
    their start (a pair of loops over a forward's 860 calls was most of this accounting)."""
    outermost: set[int] = set()
    latest = -1
    by_start = sorted(calls, key=lambda c: c.started)
    for _, together in itertools.groupby(by_start, key=lambda c: c.started):
        started = list(together)  # (calls not seen starting share -1: none holds another)
        outermost.update(id(c) for c in started if not c.order < latest)
        latest = max(latest, *(c.order for c in started))
    return outermost


def _replayed(autograd: Sequence[ModuleCall], no_grad: Sequence[ModuleCall]) -> bool:
    """The no_grad call made the same module calls, taking and returning the same values."""
    if [c.name for c in autograd] != [c.name for c in no_grad]:
        return False
    return all(len(a.inputs) == len(b.inputs) and len(a.outputs) == len(b.outputs)
               and all(identical(x.value, y.value)
                       for x, y in zip(a.inputs + a.outputs, b.inputs + b.outputs, strict=True))
               for a, b in zip(autograd, no_grad, strict=True))


class _Values:
    """Values known to be accounted for, found again by the memory they view, else by a
    probe of a few elements. The probes are read only once a value is not found by its
    memory: a close port's values are the reference's own tensors (``capture``'s
    ``share``), and probing every value the reference's modules saw cost more than the
    rule's other checks together."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[object, ...], list[torch.Tensor]] = {}
        self.memory: set[tuple[object, ...]] = set()
        self.storages: set[tuple[int, object]] = set()
        self.unkeyed: list[torch.Tensor] = []  # added, not yet probed

    def add(self, leaves: Iterable[Leaf]) -> None:
        for leaf in leaves:
            value = leaf.value
            self.memory.add(_where(value))
            self.storages.add((value.untyped_storage().data_ptr(), value.device))
            self.unkeyed.append(value)

    def holds(self, value: torch.Tensor) -> bool:
        if _where(value) in self.memory:  # the same tensor: the same values
            return True
        if (value.untyped_storage().data_ptr(), value.device) in self.storages:
            return True  # a view of one (``x[:, 0]``): some of its elements, unchanged
        for known in self.unkeyed:
            self.by_key.setdefault(_key(known), []).append(known)
        self.unkeyed.clear()
        return any(identical(value, known) for known in self.by_key.get(_key(value), []))


def _where(t: torch.Tensor) -> tuple[object, ...]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            t.dtype, t.device)


def _key(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.dtype, probe(t, _PROBE))


__all__ = ["computed_by_glue", "unaccounted"]
