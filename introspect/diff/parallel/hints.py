"""Why a tensor-parallel port parts from its reference: the faults only TP ports have.

Each hint is tested on the ranks' own values at the first divergence, never guessed from
names:

- **an all-reduce left out**: the ranks disagree, no rank's value matches the reference,
  but their sum does (less the bias each rank added after its partial product), and the
  value reaches no collective; or a node the divergence reads is a partial sum (joined as
  a sum) that no collective summed before it was used;
- **a bias added on every rank before the sum**: the value, less (N-1) times the
  reference module's bias, matches, and it is (or feeds) an all-reduce;
- **shards concatenated in the wrong order**: the value cut into N blocks along one dim
  and put back in another order matches;
- **which rank**: a concatenation whose blocks are compared one by one (rank r's shard is
  off), or ranks kept apart because they disagree.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch

from introspect.diff.parallel.collectives import COLLECTIVE_NAMES
from introspect.diff.parallel.join import CONCATENATED, PER_RANK, SUMMED, Join, JoinedRanks
from introspect.dump.match import best_layout

# Nodes that sum partial values across ranks (ours, and DTensor's conversions).
_SUMMING = frozenset({*COLLECTIVE_NAMES, "redistribute", "full_tensor", "all_reduce",
                      "reduce_scatter_tensor", "wait_tensor"})
_MAX_PERMUTED = 4  # all orders of up to 4 blocks; beyond, the reversed and rotated ones


def parallel_hints(join: Join, joined: JoinedRanks, target: torch.Tensor,
                   value: torch.Tensor, allowance: float, bias: torch.Tensor | None,
                   layout_apply: object = None,
                   references: Mapping[str, torch.Tensor] | None = None,
                   paired: set[str] | None = None) -> list[str]:
    """The hints that hold at the first divergence, most specific first.

    Args:
        join: how the divergent tensor was joined.
        joined: every rank's values, and the port's graph (sources and ops).
        target: the reference's value; ``value`` the joined one in the reference's layout.
        allowance: the budget at this node (atol + rtol * scale).
        bias: the bias of the reference module the node belongs to, when it has one.
        references: the reference's values by node, and ``paired`` the joined tensors the
            diff paired with one: a tensor the divergence reads that holds a reference
            node's values in another order is tested for shards out of order.
    """
    hints: list[str] = []
    n = len(joined.ranks)
    held = [r[join.node] for r in joined.ranks if join.node in r]
    apply = layout_apply if callable(layout_apply) else (lambda t: t)

    def fits(candidate: torch.Tensor) -> bool:
        if candidate.numel() != target.numel():
            return False
        shaped = apply(candidate).reshape(target.shape).double()
        return float((shaped - target.double()).abs().max()) <= allowance

    ranks_differ = len(held) == n and not all(torch.equal(held[0], v) for v in held[1:])
    summed_later = _reaches_sum(join.node, joined)
    if ranks_differ and held[0].shape == held[-1].shape:
        total = torch.stack(held).sum(0)
        alone = any(fits(v) for v in held)
        shifts = [(total, "")]
        added = _broadcast(bias, total) if bias is not None else None
        if added is not None:
            shifts.append((total - (n - 1) * added, " less the bias every rank added"))
        for candidate, how in shifts:
            if not alone and fits(candidate) and not summed_later:
                hints.append(f"an all-reduce left out: no rank's value of {join.node} matches "
                             f"the reference, the sum over the {n} ranks does{how}; each rank "
                             "went on with its partial sum (all_reduce the row-parallel "
                             "output before it is used)")
                break
    if not hints:
        partial = _partial_source(join.node, joined)
        if partial:
            hints.append(f"an all-reduce left out: {join.node} reads {partial}, a partial sum "
                         f"on each rank (joined as the sum over the {n} ranks), which no "
                         "collective summed first")
    added = _broadcast(bias.double(), value) if bias is not None else None
    if added is not None and not hints and (summed_later or not ranks_differ):
        shifted = value.double() - (n - 1) * added
        if float((shifted - target.double()).abs().max()) <= allowance:
            hints.append(f"a bias added on every rank before the sum: the value less "
                         f"{n - 1} x the bias matches; add the row-parallel Linear's bias "
                         "once, after the all-reduce")
    order = _wrong_order(value.reshape(target.shape), target, n, allowance) \
        or _wrong_order_read(join.node, joined, references or {}, paired or set(), allowance)
    if order:
        hints.append(order)
    hints += _blamed_ranks(join, held, target, allowance, apply)
    return hints


def _broadcast(bias: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    if like.dim() == 0 or like.shape[-1] != bias.numel():
        return None
    return bias.reshape(*([1] * (like.dim() - 1)), -1).to(like.dtype)  # (1, ..., 1, H)


def _reaches_sum(node: str, joined: JoinedRanks) -> bool:
    """Whether a collective that sums reads ``node`` (directly or through layout ops)."""
    return any(node in joined.sources.get(other, []) and op in _SUMMING
               for other, op in joined.ops.items())


def _partial_source(node: str, joined: JoinedRanks) -> str:
    """An input of ``node`` joined as a sum of partials, read without a collective."""
    if joined.ops.get(node) in _SUMMING:
        return ""
    for source in joined.sources.get(node, []):
        join = joined.joins.get(source)
        if join is not None and join.kind == SUMMED and not join.placement:
            return source
    return ""


def _wrong_order(value: torch.Tensor, target: torch.Tensor, n: int, allowance: float) -> str:
    """The value cut into ``n`` blocks along a dim, in another order, matches."""
    if n < 2:
        return ""
    for dim in range(value.dim()):
        if value.shape[dim] % n or value.shape[dim] < n:
            continue
        blocks = value.chunk(n, dim=dim)
        for order in _orders(n):
            moved = torch.cat([blocks[i] for i in order], dim=dim)
            if float((moved.double() - target.double()).abs().max()) <= allowance:
                return (f"shards concatenated in the wrong order: the value cut into {n} "
                        f"blocks along dim {dim} and put back in the order {order} matches "
                        "(concatenate the gathered shards in rank order)")
    return ""


def _wrong_order_read(node: str, joined: JoinedRanks, references: Mapping[str, torch.Tensor],
                      paired: set[str], allowance: float) -> str:
    """An unpaired tensor ``node`` reads whose blocks, reordered, are a reference node's
    values under some layout (a gathered value concatenated in the wrong order)."""
    n = len(joined.ranks)
    for source in joined.sources.get(node, []):
        value = joined.dump.values.get(source)
        if value is None or source in paired or not value.is_floating_point():
            continue
        mine = value.detach().reshape(-1).double().sort().values
        for name, target in references.items():
            if target.numel() != value.numel() or not target.is_floating_point():
                continue
            theirs = target.detach().reshape(-1).double().sort().values
            if float((mine - theirs).abs().max()) > allowance:
                continue  # not the same values: no order of blocks can make them equal
            for dim in range(value.dim()):
                if value.shape[dim] % n:
                    continue
                blocks = value.chunk(n, dim=dim)
                for order in _orders(n):
                    found = best_layout(torch.cat([blocks[i] for i in order], dim=dim), target)
                    if found is not None and found[1] <= allowance:
                        return (f"shards concatenated in the wrong order: {source}, which "
                                f"{node} reads, holds {name}'s values, and does once its {n} "
                                f"blocks along dim {dim} are put back in the order {order} "
                                "(concatenate the gathered shards in rank order)")
    return ""


def _orders(n: int) -> list[tuple[int, ...]]:
    identity = tuple(range(n))
    if n <= _MAX_PERMUTED:
        return [p for p in itertools.permutations(range(n)) if p != identity]
    rotations = [tuple((i + k) % n for i in range(n)) for k in range(1, n)]
    return [tuple(reversed(identity)), *rotations]


def _blamed_ranks(join: Join, held: Sequence[torch.Tensor], target: torch.Tensor,
                  allowance: float, apply: object) -> list[str]:
    """Which rank holds the wrong values, where the join lets one tell."""
    if join.kind == PER_RANK:
        return [f"rank {join.rank}'s value is the one compared here: the ranks disagree on "
                f"{join.node}, which every rank should hold whole"]
    if join.kind != CONCATENATED or join.dim is None or not callable(apply):
        return []
    # each rank's block of the reference, found by cutting the reference where the ranks
    # were joined: the joined value is laid out like the reference by ``apply``
    starts = list(itertools.accumulate([0, *[v.shape[join.dim] for v in held]]))
    shape = [*held[0].shape[:join.dim], starts[-1], *held[0].shape[join.dim + 1:]]
    index = torch.arange(target.numel()).reshape(shape)
    # placed[p]: the joined element that sits at the reference's position p
    placed = apply(index.to(torch.float64)).reshape(-1).long()
    joined = apply(torch.cat(list(held), dim=join.dim)).reshape(-1).double()
    flat_target = target.reshape(-1).double()
    wrong = []
    for rank in range(len(held)):
        mine = index.narrow(join.dim, starts[rank], starts[rank + 1] - starts[rank]).reshape(-1)
        where = torch.isin(placed, mine)
        error = float((joined[where] - flat_target[where]).abs().max()) if where.any() else 0.0
        if error > allowance:
            wrong.append((rank, error))
    if 0 < len(wrong) < len(held):
        shown = ", ".join(f"rank {r} (max abs error {e:.3g})" for r, e in wrong)
        return [f"the fault is on {shown}: the other ranks' shards of {join.node} match"]
    return []


def reference_bias(model: object, module: str) -> torch.Tensor | None:
    """The bias of the reference module ``module`` (a path), when it has one."""
    getter = getattr(model, "get_submodule", None)
    if not module or not callable(getter):
        return None
    for path in (module, module.partition(".")[2]):  # with or without the root's prefix
        try:
            found = getter(path)
        except AttributeError:
            continue
        bias = getattr(found, "bias", None)
        if isinstance(bias, torch.Tensor):
            return bias.detach()
    return None


__all__ = ["parallel_hints", "reference_bias"]
