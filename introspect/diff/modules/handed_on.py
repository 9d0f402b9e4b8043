"""What the candidate's code between two modules hands on, where the reference hands the
same value on unchanged: a layer's output given to the next layer in the model's own loop.

Module evidence judges each module on the reference's inputs to it, and what an
ancestor's run on the reference's inputs hands the modules inside it (``handovers``)
against that run's own noise. Code between two sibling modules (``h = layer(h) * (1 +
2e-6)`` in an encoder's loop) is judged there only through that noise, layers deep, and a
slip of a few dozen roundings passed. Yet where the reference hands one value on
unchanged (the tensor one of its modules returned is the one the next took), the
candidate's code between the module standing for the first and the module standing for
the second must compute the identity too: in the candidate's own plain call, what the
second took is what the first returned, bit for bit (a copy, a view, a dtype there and
back), or within a few roundings (``x * 3 / 3``). That is held here, at real tokens: the
largest gap to 16 roundings of the value's largest magnitude, the mean gap to 4 roundings
of its mean magnitude (a slip moves every element alike; rounding moves each by its own
fraction of one).

Only where it is proven: both modules paired by the weights they own, in the first plain
call (autograd on), the first finished before the second started (in any thread), neither
called under vmap, neither value edited in place since, the same shape. Where
several of the candidate's calls stand for the value handed, the one nearest to what was
taken is held to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from introspect.diff.modules.budget import FLOOR_UNITS
from introspect.diff.modules.gaps import kept, largest, largest_gap, mean_gap, mean_magnitude
from introspect.diff.modules.local import UNIT
from introspect.diff.modules.pairing import Match, ModulePair, view_key
from introspect.diff.modules.paths import depth, within
from introspect.run.capture import Leaf, ModuleCall
from introspect.run.truth import AUTOGRAD, identical

HANDED_ON = "what code between modules hands on"  # how such a row's note begins
MOVED_ALIKE = "what it took is on average"  # such a note where the mean gap failed
MEAN_UNITS = 4.0  # roundings of the mean magnitude the mean gap may reach


@dataclasses.dataclass(frozen=True)
class HandedOn:
    """One value the candidate's code moved between a module's output and the input of
    another, where the reference hands it on unchanged."""

    giver: ModulePair  # the module call whose output stands for the value
    taker: ModulePair  # the module call that took it
    path: str  # the taker's input ("args.0")
    returned_by: str  # the outermost reference module that returned the value
    taken_by: str  # the outermost reference module in the taker's region that took it
    error: float  # the largest gap between what was taken and what was given
    limit: float
    mean_error: float
    mean_limit: float

    @property
    def on_average(self) -> bool:
        """Failed on the mean only (every element moved alike, each within the largest's
        budget)."""
        return self.error <= self.limit

    @property
    def shown(self) -> tuple[float, float]:
        return (self.mean_error, self.mean_limit) if self.on_average \
            else (self.error, self.limit)

    @property
    def note(self) -> str:
        """The failing row's note: what was handed whom, and by how much it moved."""
        how = (f"{MOVED_ALIKE} {self.mean_error:.3g} from it (budget {self.mean_limit:.3g}: "
               f"{MEAN_UNITS:g} roundings of its mean magnitude; every element moved alike, "
               f"its largest gap {self.error:.3g} within {self.limit:.3g})"
               if self.on_average else
               f"what it took is {self.error:.3g} from it (budget {self.limit:.3g}: "
               f"{FLOOR_UNITS:g} roundings of its largest magnitude)")
        taker, giver = self.taker.call.name, self.giver.call.name
        return (f"{HANDED_ON} {taker or 'the model'} ({self.path}): it took what "
                f"{giver or 'the model'} returned, as the reference's {self.taken_by} takes "
                f"what its {self.returned_by} returned, unchanged; {how}")


def handed_on(pairs: Sequence[ModulePair], attention_mask: torch.Tensor | None,
              ) -> list[HandedOn]:
    """Each value over its budget (see the module's docstring), in the takers' order."""
    proven = [p for p in pairs if _proven(p)]
    # by the reference value their output stands for, keyed by the memory it views: a
    # port that runs the batch's rows one at a time stands for a row of it, and each
    # module's match makes a view of its own (probe round o: rows in two threads, scaled
    # between two layers by 1 + 2e-5, passed)
    givers: dict[tuple[object, ...], list[ModulePair]] = {}
    for pair in proven:
        boundary = pair.output.boundary
        if boundary.returned_by:  # (returned by one of the reference's modules, the very
            # tensor the module standing for a taker took: the reference hands it on as is)
            givers.setdefault(view_key(boundary.value), []).append(pair)
    found = []
    seen: set[int] = set()  # the values taken already: an outer taker's, not its parts'
    for taker in sorted(proven, key=lambda p: p.call.started):
        if taker.call.edited_inputs:
            continue
        for match in taker.inputs:
            taken_by = _taken_there(match, taker.region)
            if taken_by is None:
                continue
            before = [g for g in givers.get(view_key(match.boundary.value), ())
                      if _finished_before(g.call, taker.call)]
            taken = _leaf(taker.call.inputs, match.path)
            given = [(g, leaf) for g in before
                     if (leaf := _leaf(g.call.outputs, g.output.path)) is not None]
            if taken is None or not given or id(taken.held) in seen \
                    or any(identical(taken.value, leaf.value) for _, leaf in given):
                continue
            seen.add(id(taken.held))
            returned_by = min(match.boundary.returned_by, key=lambda n: (depth(n), n))
            judged = [_judged(g, taker, match.path, leaf.value, taken.value,
                              match.boundary.value, attention_mask, (returned_by, taken_by))
                      for g, leaf in given]
            nearest = min((j for j in judged if j is not None),  # (the outermost giver
                          key=lambda j: (j.error, j.giver.call.started), default=None)  # of one)
            if nearest is not None and (nearest.error > nearest.limit
                                        or nearest.mean_error > nearest.mean_limit):
                found.append(nearest)
    return found


def _proven(pair: ModulePair) -> bool:
    call = pair.call
    # (a call in a worker thread too: the capture numbers every thread's calls on one
    # count as they start and finish, and the value taken is held to what was given; a
    # model's loop run in a thread, scaling a layer's output there, passed: probe round o)
    return pair.by == "weights" and call.mode == AUTOGRAD \
        and call.batched is None and call.started >= 0


def _taken_there(match: Match, region: str) -> str | None:
    """The outermost module of the taker's region that took the reference value standing
    for the input (and did not return it: the very tensor, handed on as it was); None."""
    boundary = match.boundary
    return min((holder for holder in boundary.holders - boundary.returned_by
                if within(holder, region)), key=lambda name: (depth(name), name), default=None)


def _finished_before(first: ModuleCall, then: ModuleCall) -> bool:
    """``first`` returned before ``then`` began: it began earlier and ``then`` did not run
    inside it (calls in one thread nest)."""
    return first is not then and first.started < then.started and first.order < then.order


def _leaf(leaves: Sequence[Leaf], path: str) -> Leaf | None:
    leaf = next((leaf for leaf in leaves if leaf.path == path), None)
    return leaf if leaf is not None and leaf.unchanged() else None


def _judged(giver: ModulePair, taker: ModulePair, path: str, given: torch.Tensor,
            taken: torch.Tensor, reference: torch.Tensor,
            attention_mask: torch.Tensor | None, names: tuple[str, str]) -> HandedOn | None:
    """What was taken held to what was given (None: not comparable)."""
    if tuple(given.shape) != tuple(taken.shape) or tuple(given.shape) != tuple(reference.shape) \
            or not given.is_floating_point() or not taken.is_floating_point() \
            or given.device != taken.device:
        return None
    keep = kept(given, taken, attention_mask)
    keep = keep & kept(reference, taken, attention_mask)
    unit = max(UNIT.get(t.dtype, UNIT[torch.float32]) for t in (given, taken, reference))
    return HandedOn(giver, taker, path, *names, largest_gap(taken, given, keep),
                    FLOOR_UNITS * unit * largest(given, keep),
                    mean_gap(taken, given, keep), MEAN_UNITS * unit * mean_magnitude(given, keep))


__all__ = ["HANDED_ON", "MEAN_UNITS", "MOVED_ALIKE", "HandedOn", "handed_on"]
