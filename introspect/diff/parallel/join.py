"""Join every rank's local values back into whole tensors, by value against the reference.

Under tensor parallelism one quantity is held three ways: replicated (every rank holds the
whole, bit for bit), sharded (a column-parallel Linear's output: the whole is the ranks'
values concatenated along one dim) or partial (a row-parallel Linear's product before its
all-reduce: the whole is their sum). A DTensor says which (its placements, read when
present); a plain tensor does not, so each way of joining is tried and kept when it holds
the values of some reference node (within budget, compared as sorted values, which no
layout changes; the dim of a concatenation is the one under which the best layout fits).

When no join agrees (a fault), the closest is kept, and ranks whose values should be equal
but are not are kept apart, one tensor per rank (``name@rank1``), so that the diff blames
the rank. The result is a ``Dump`` in the port's order, which the dump diff aligns to the
reference by value (``introspect.dump``), and one ``Join`` per tensor saying how it was made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from introspect.diff.tolerance import Tolerance
from introspect.dump.formats import Dump
from introspect.dump.match import best_layout
from introspect.spread import spread

REPLICATED, CONCATENATED, SUMMED, PER_RANK = "replicated", "concatenated", "summed", "per rank"
_PREFERENCE = (REPLICATED, CONCATENATED, SUMMED, PER_RANK)  # among joins that agree


@dataclass(frozen=True)
class Join:
    """How one joined tensor was made from the ranks' values."""

    name: str  # the tensor's name in the joined dump (``name@rank<r>`` when per rank)
    node: str  # the port's node name, the same on every rank
    kind: str  # REPLICATED, CONCATENATED, SUMMED or PER_RANK
    dim: int | None = None  # the dim of a concatenation
    rank: int | None = None  # the rank of a per-rank tensor
    placement: str = ""  # the DTensor placement that decided it, when there was one
    ranks: int = 1

    def __str__(self) -> str:
        how = {REPLICATED: f"the same on all {self.ranks} ranks",
               CONCATENATED: f"the {self.ranks} ranks' shards concatenated along dim {self.dim}",
               SUMMED: f"the sum of the {self.ranks} ranks' partial values",
               PER_RANK: f"rank {self.rank}'s own value (the ranks disagree)"}[self.kind]
        return how + (f" (DTensor {self.placement})" if self.placement else "")


@dataclass
class JoinedRanks:
    """The joined dump, how each tensor was made, and every rank's values to hint with."""

    dump: Dump
    joins: dict[str, Join]  # joined tensor name -> how
    ranks: list[Mapping[str, torch.Tensor]]  # per rank: node name -> local value
    sources: dict[str, list[str]] = field(default_factory=dict)  # node -> computing inputs
    ops: dict[str, str] = field(default_factory=dict)  # node -> op
    notes: list[str] = field(default_factory=list)


class _References:
    """The reference's values by size, each kept sorted once: the cheap bound of a join."""

    def __init__(self, values: Mapping[str, torch.Tensor], tolerance: Tolerance) -> None:
        self.values = values
        self.tolerance = tolerance
        self.by_size: dict[int, list[str]] = {}
        for name, value in values.items():
            if value.is_floating_point():
                self.by_size.setdefault(value.numel(), []).append(name)
        self._sorted: dict[str, torch.Tensor] = {}
        self._quantiles: dict[str, torch.Tensor] = {}

    def sorted(self, name: str) -> torch.Tensor:
        if name not in self._sorted:
            self._sorted[name] = _sorted_values(self.values[name])
        return self._sorted[name]

    def scale(self, name: str) -> float:
        """The node's largest magnitude: an end of its sorted values."""
        ordered = self.sorted(name)
        return max(abs(float(ordered[0])), abs(float(ordered[-1]))) if ordered.numel() else 0.0

    def quantiles(self, name: str) -> torch.Tensor:
        if name not in self._quantiles:
            self._quantiles[name] = _quantiles(self.sorted(name))
        return self._quantiles[name]

    def closest(self, value: torch.Tensor) -> tuple[str, float, bool]:
        """The reference node whose sorted values are nearest; that error over its scale,
        and whether it is within budget. ("", inf, False) when no node has its size.

        Each node's few quantiles bound its error from below (they are some of the sorted
        differences), so the full comparison runs only where it could win."""
        mine = _sorted_values(value)
        if not mine.numel():
            return ("", math.inf, False)
        points = _quantiles(mine)
        scales = {name: self.scale(name) for name in self.by_size.get(value.numel(), [])}
        bounds = sorted((float((points - self.quantiles(name)).abs().max())
                         / max(scale, 1e-12), name) for name, scale in scales.items())
        best = ("", math.inf, False)
        for bound, name in bounds:
            if math.isnan(bound) or bound >= best[1]:
                continue
            error = float((mine - self.sorted(name)).abs().max())
            if math.isnan(error):
                continue
            relative = error / max(scales[name], 1e-12)
            if relative < best[1]:
                budget = self.tolerance.node_budget(str(self.values[name].dtype).split(".")[-1])
                best = (name, relative, error <= budget.atol + budget.rtol * scales[name])
        return best

    def regrouped(self, value: torch.Tensor) -> bool:
        """A reference node of the same shape that ``value`` equals but for one constant
        per feature (a row-parallel product summed before its bias is added)."""
        for name in self.by_size.get(value.numel(), []):
            theirs = self.values[name]
            if theirs.shape != value.shape or value.dim() < 2:
                continue
            offset = (value.double() - theirs.double())
            spread = offset - offset.reshape(-1, offset.shape[-1]).mean(0)
            budget = self.tolerance.node_budget(str(theirs.dtype).split(".")[-1])
            if float(spread.abs().max()) <= budget.atol + budget.rtol * float(theirs.abs().max()):
                return True
        return False


def join_ranks(ranks: Sequence[Mapping[str, torch.Tensor]], order: Sequence[str],
               reference: Mapping[str, torch.Tensor], *, tolerance: Tolerance | None = None,
               placements: Mapping[str, Sequence[str] | None] | None = None,
               path: str = "ranks") -> JoinedRanks:
    """Join the ranks' values of every node named in ``order`` into a ``Dump``.

    Args:
        ranks: per rank, node (or dumped tensor) name -> that rank's local value.
        order: the names in the order the port computed them (rank 0's).
        reference: the reference's values by node name (a ``Capture``'s ``values``).
        tolerance: the budgets that decide whether a join agrees with a reference node.
        placements: a DTensor's placements by name, when the rank recorded one.
        path: where the values came from, for the dump's name.
    """
    tolerance = tolerance or Tolerance()
    references = _References(reference, tolerance)
    values: dict[str, torch.Tensor] = {}
    joins: dict[str, Join] = {}
    for name in order:
        held = [r[name] for r in ranks if name in r]
        if len(held) < len(ranks):  # not on every rank: each rank's own
            found = [_per_rank(name, i, len(ranks)) for i, r in enumerate(ranks) if name in r]
            parts = [r[name] for r in ranks if name in r]
        else:
            found, parts = _join(name, held, references, (placements or {}).get(name))
        for join, part in zip(found, parts, strict=True):
            values[join.name] = part
            joins[join.name] = join
    dtypes = {k: str(v.dtype).split(".")[-1] for k, v in values.items()}
    floats = {k: v for k, v in values.items() if v.is_floating_point()}
    integers = {k: v for k, v in values.items() if not v.is_floating_point()}
    counts = {kind: sum(j.kind == kind for j in joins.values()) for kind in _PREFERENCE}
    notes = [f"{len(ranks)} ranks joined into whole tensors by value: "
             + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)]
    dump = Dump(path, floats, {k: dtypes[k] for k in floats}, True, integers)
    return JoinedRanks(dump, joins, list(ranks), notes=notes)


def _per_rank(name: str, rank: int, ranks: int) -> Join:
    return Join(f"{name}@rank{rank}", name, PER_RANK, rank=rank, ranks=ranks)


def _join(name: str, held: list[torch.Tensor], references: _References,
          placement: Sequence[str] | None) -> tuple[list[Join], list[torch.Tensor]]:
    n = len(held)
    if placement:
        joined = _by_placement(name, held, placement[0])
        if joined is not None:
            return joined
    if all(_equal(held[0], v) for v in held[1:]):
        return [Join(name, name, REPLICATED, ranks=n)], [held[0]]
    options: list[tuple[Join, torch.Tensor]] = []
    if all(v.shape == held[0].shape for v in held) and held[0].is_floating_point():
        options.append((Join(name, name, SUMMED, ranks=n), torch.stack(held).sum(0)))
    options += _concatenations(name, held, references)
    scored: list[tuple[bool, float, int, Join | None, torch.Tensor | None]] = []
    for join, value in options:
        closest, relative, agrees = references.closest(value) if value.is_floating_point() \
            else ("", math.inf, False)
        if not agrees and join.kind == SUMMED and references.regrouped(value):
            agrees, relative = True, 0.0
        scored.append((not agrees, relative if closest else math.inf,
                       _PREFERENCE.index(join.kind), join, value))
    agreed = any(not s[0] for s in scored)
    per_rank = [references.closest(v) for v in held] \
        if held[0].is_floating_point() and not agreed else []
    if any(a for _, _, a in per_rank) or not scored:  # one rank wrong where all should agree
        scored.append((False, 0.0, _PREFERENCE.index(PER_RANK), None, None))
    scored.sort(key=lambda s: (s[0], s[1] if s[0] else 0.0, s[2]))
    _, _, _, chosen, whole = scored[0]
    if chosen is None or whole is None:  # the ranks disagree and no join explains them
        return [_per_rank(name, i, n) for i in range(n)], list(held)
    return [chosen], [whole]


def _concatenations(name: str, held: list[torch.Tensor], references: _References
                    ) -> list[tuple[Join, torch.Tensor]]:
    """The concatenation along the dim whose best layout fits a reference node best."""
    first = held[0]
    dims = [d for d in range(first.dim())
            if all(v.dim() == first.dim() and all(v.shape[k] == first.shape[k]
                                                  for k in range(first.dim()) if k != d)
                   for v in held)]
    if not dims:
        return []
    joined = {d: torch.cat(held, dim=d) for d in dims}
    target, _, _ = references.closest(joined[dims[0]]) if first.is_floating_point() \
        else ("", 0.0, False)
    if len(dims) > 1 and target:
        reference = references.values[target]
        budget = references.tolerance.node_budget(str(reference.dtype).split(".")[-1])
        allowance = budget.atol + budget.rtol * references.scale(target)
        direct = [d for d in dims if joined[d].shape == reference.shape and float(
            (joined[d].double() - reference.double()).abs().max()) <= allowance]
        if direct:  # within budget in the same layout: no other needs trying
            dims = direct

    if len(dims) > 1 and target:
        def fit(d: int) -> tuple[float, bool]:  # the closest; the same layout first on ties
            found = best_layout(joined[d], references.values[target])
            return (found[1], not found[0].identity) if found else (math.inf, True)
        dims.sort(key=fit)
    d = dims[0]
    return [(Join(name, name, CONCATENATED, dim=d, ranks=len(held)), joined[d])]


def _by_placement(name: str, held: list[torch.Tensor], placement: str
                  ) -> tuple[list[Join], list[torch.Tensor]] | None:
    n = len(held)
    if placement.startswith("Shard("):
        dim = int(placement[len("Shard("):-1])
        dim = dim % held[0].dim() if held[0].dim() else 0
        return [Join(name, name, CONCATENATED, dim=dim, placement=placement, ranks=n)], \
            [torch.cat(held, dim=dim)]
    if placement == "Partial":
        return [Join(name, name, SUMMED, placement=placement, ranks=n)], \
            [torch.stack(held).sum(0)]
    if all(_equal(held[0], v) for v in held[1:]):
        return [Join(name, name, REPLICATED, placement=placement, ranks=n)], [held[0]]
    return None  # Replicate, but the ranks disagree: joined by value, blamed per rank


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.nan_to_num(), b.nan_to_num()))


def _quantiles(ordered: torch.Tensor, points: int = 257) -> torch.Tensor:
    """``points`` evenly spaced entries of a sorted flat tensor."""
    index = spread(ordered.numel(), points)
    return ordered[index]


def _sorted_values(value: torch.Tensor) -> torch.Tensor:
    flat = value.detach().reshape(-1).double()
    return torch.nan_to_num(flat, nan=0.0).sort().values
