"""Align a port's dumped tensors to the reference nodes that hold the same quantity.

No name map is needed. A layout change (a transpose, heads split or merged, a batch dim
of 1 dropped) only moves elements around, so a dumped tensor and its reference node hold
the same multiset of values: sorting both and comparing gives a lower bound of the error
under *any* layout, cheap enough to try against every reference node of the same size.

1. **By value**: a dumped tensor whose values the reference node holds (within budget,
   under the best layout) is paired with it.
2. **By order**: when the dump's order is known, tensors that match nothing by value
   (a fault, and everything after it) are paired with reference nodes of the same size
   by a monotone alignment of the two sequences (like a diff of two files), preferring
   the closest values; so a faulty tensor lands on the node it was meant to be.
3. **Closest**: without an order, each such tensor is paired with the closest free node.

A tensor of a size no reference node has matches nothing, and says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from introspect.errors import InputError

BY_NAME, BY_VALUE, BY_ORDER, BY_CLOSEST = "name", "value", "order", "closest"
_UNASSIGNED_COST = 1.0  # the cost of leaving a dumped tensor unpaired, in the DP below
_VALUE_RETRIES = 3  # closest free nodes tried by value for a tensor the order pass left out
_MAX_PERMUTED_DIMS = 5  # up to 120 permutations of a dumped tensor's dims are tried


@dataclass(frozen=True)
class Layout:
    """How a dumped tensor maps onto its reference node.

    Either its own dims are permuted and the result reshaped to the node's shape (heads
    split where the port merged them), or it is first reshaped to the node's dims in
    another order and then permuted (heads merged where the reference keeps them apart).
    """

    permutation: tuple[int, ...]
    dump_shape: tuple[int, ...]
    reference_shape: tuple[int, ...]
    reshape_first: bool = False

    def apply(self, value: torch.Tensor) -> torch.Tensor:
        if self.reshape_first:
            order = [self.reference_shape[i] for i in self.permutation]
            inverse = sorted(range(len(self.permutation)), key=self.permutation.__getitem__)
            return value.reshape(order).permute(inverse).reshape(self.reference_shape)
        return value.permute(self.permutation).reshape(self.reference_shape)

    def __str__(self) -> str:
        identity = self.permutation == tuple(range(len(self.permutation)))
        if self.reshape_first:
            order = tuple(self.reference_shape[i] for i in self.permutation)
            return "same layout" if identity and self.dump_shape == self.reference_shape else \
                f"reshaped {self.dump_shape} -> {order}, dims permuted to {self.reference_shape}"
        steps = [] if identity else [f"dims permuted {self.permutation}"]
        permuted = tuple(self.dump_shape[i] for i in self.permutation)
        if permuted != self.reference_shape:
            steps.append(f"reshaped {permuted} -> {self.reference_shape}")
        return ", ".join(steps) or "same layout"


@dataclass(frozen=True)
class DumpMatch:
    """Where one dumped tensor went."""

    name: str  # the tensor's name in the dump
    position: int  # its position in the dump
    reference: str  # the reference node it is paired with ("" when none)
    matched_by: str  # BY_NAME, BY_VALUE, BY_ORDER, BY_CLOSEST, "" when unpaired
    layout: Layout | None
    closest: str = ""  # unpaired: the closest reference node of the same size, if any
    closest_max_abs_err: float | None = None


def best_layout(value: torch.Tensor, reference: torch.Tensor) -> tuple[Layout, float] | None:
    """The layout under which ``value`` is closest to ``reference``, and that max abs error.

    None when the two hold different numbers of elements.
    """
    if value.numel() != reference.numel():
        return None
    wide, target = value.double(), reference.double()
    best: tuple[Layout, float] | None = None
    for layout in _layouts(tuple(value.shape), tuple(reference.shape)):
        error = _max_abs(layout.apply(wide), target)
        if best is None or error < best[1]:
            best = (layout, error)
            if error == 0.0:
                break
    return best


def _layouts(dump_shape: tuple[int, ...], reference_shape: tuple[int, ...]) -> list[Layout]:
    """Every layout tried, the plain reshape first."""
    def orders(n: int) -> list[tuple[int, ...]]:
        return list(itertools.permutations(range(n))) if n <= _MAX_PERMUTED_DIMS \
            else [tuple(range(n))]

    layouts = [Layout(p, dump_shape, reference_shape) for p in orders(len(dump_shape))]
    layouts += [Layout(p, dump_shape, reference_shape, reshape_first=True)
                for p in orders(len(reference_shape))[1:]]
    return layouts


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    difference = (a - b).abs()
    return math.inf if difference.isnan().any() else float(difference.max()) if a.numel() else 0.0


class _Sorted:
    """Each tensor's values sorted once: the lower bound of its error under any layout."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.values = {k: v.detach().double().flatten().sort().values for k, v in tensors.items()}
        self.scale = {k: float(v.abs().max()) if v.numel() else 0.0
                      for k, v in self.values.items()}

    def bound(self, a: str, other: _Sorted, b: str) -> float:
        x, y = self.values[a], other.values[b]
        return _max_abs(x, y) if x.numel() == y.numel() else math.inf


def match_dump(dump: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], *,
               ordered: bool, agrees: Callable[[str, str, torch.Tensor], bool],
               name_map: Mapping[str, str] | None = None) -> list[DumpMatch]:
    """Pair every dumped tensor with the reference node holding the same quantity.

    Args:
        dump: the port's tensors by its own names, in the order it produced them when
            ``ordered``.
        reference: the reference's values by node name, in graph order.
        ordered: whether ``dump``'s order is the order of production.
        agrees: ``(dump name, reference node, dumped value in the node's layout) -> bool``:
            whether the two agree within the node's budget.
        name_map: optional help: dump name -> reference node name.

    Returns:
        One ``DumpMatch`` per dumped tensor, in the dump's order.

    Raises:
        InputError: a name map that names tensors or nodes that do not exist.
    """
    names, ref_names = list(dump), list(reference)
    fixed = _named_pairs(name_map or {}, dump, reference)
    dump_sorted, ref_sorted = _Sorted(dump), _Sorted(reference)
    cost = {(i, j): _cost(dump_sorted.bound(a, ref_sorted, b),
                          max(dump_sorted.scale[a], ref_sorted.scale[b]))
            for i, a in enumerate(names) for j, b in enumerate(ref_names)
            if a not in fixed and b not in fixed.values()
            and dump[a].numel() == reference[b].numel()}
    free = [i for i, a in enumerate(names) if a not in fixed]
    assigned = _monotone(free, len(ref_names), cost) if ordered else _greedy(cost)
    # Tensors the port produced in another order than the reference (v before q, say)
    # are left out by the monotone pass: they still pair by value.
    used = set(assigned.values()) | {ref_names.index(r) for r in fixed.values()}
    for i in free:
        if i in assigned:
            continue
        options = sorted((c, j) for (k, j), c in cost.items() if k == i and j not in used)
        for _, j in options[:_VALUE_RETRIES]:
            fit = best_layout(dump[names[i]], reference[ref_names[j]])
            if fit is not None and agrees(names[i], ref_names[j], fit[0].apply(dump[names[i]])):
                assigned[i] = j
                used.add(j)
                break
    matches = []
    for i, name in enumerate(names):
        if name in fixed:
            matches.append(_paired(i, name, fixed[name], BY_NAME, dump, reference))
        elif i in assigned:
            ref = ref_names[assigned[i]]
            paired = _paired(i, name, ref, BY_ORDER if ordered else BY_CLOSEST, dump, reference)
            if paired.layout is not None and agrees(name, ref, paired.layout.apply(dump[name])):
                paired = DumpMatch(name, i, ref, BY_VALUE, paired.layout)
            matches.append(paired)
        else:
            matches.append(_unpaired(i, name, dump, reference, ref_names, cost))
    return matches


def _cost(bound: float, scale: float) -> float:
    """How far apart two tensors are, from 0 (same values) to just under 1 (unrelated)."""
    if math.isinf(bound) or math.isnan(bound):
        return 0.999
    return min(0.999, bound / (scale + 1e-12))


def _named_pairs(name_map: Mapping[str, str], dump: Mapping[str, torch.Tensor],
                 reference: Mapping[str, torch.Tensor]) -> dict[str, str]:
    for name, node in name_map.items():
        if name not in dump:
            raise InputError(f"the name map names {name!r}, which the dump does not hold")
        if node not in reference:
            raise InputError(f"the name map pairs {name!r} with {node!r}, which is not a "
                             "compared node of the reference")
    return dict(name_map)


def _monotone(rows: Sequence[int], columns: int, cost: Mapping[tuple[int, int], float]
              ) -> dict[int, int]:
    """The pairing of dumped tensors with reference nodes that keeps both orders and costs
    least (an unpaired tensor costs ``_UNASSIGNED_COST``): dynamic programming."""
    n = len(rows)
    best = [[0.0] * (columns + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        best[i][0] = i * _UNASSIGNED_COST
        for j in range(1, columns + 1):
            options = [best[i][j - 1], best[i - 1][j] + _UNASSIGNED_COST]
            pair = cost.get((rows[i - 1], j - 1))
            if pair is not None:
                options.append(best[i - 1][j - 1] + pair)
            best[i][j] = min(options)
    assigned: dict[int, int] = {}
    i, j = n, columns
    while i > 0 and j > 0:
        pair = cost.get((rows[i - 1], j - 1))
        if pair is not None and best[i][j] == best[i - 1][j - 1] + pair:
            assigned[rows[i - 1]] = j - 1
            i, j = i - 1, j - 1
        elif best[i][j] == best[i - 1][j] + _UNASSIGNED_COST:
            i -= 1
        else:
            j -= 1
    return assigned


def _greedy(cost: Mapping[tuple[int, int], float]) -> dict[int, int]:
    """Closest pairs first, each tensor and node used once (the order is unknown)."""
    assigned: dict[int, int] = {}
    taken: set[int] = set()
    for (i, j), _ in sorted(cost.items(), key=lambda item: (item[1], item[0])):
        if i not in assigned and j not in taken:
            assigned[i] = j
            taken.add(j)
    return assigned


def _paired(position: int, name: str, ref: str, how: str, dump: Mapping[str, torch.Tensor],
            reference: Mapping[str, torch.Tensor]) -> DumpMatch:
    fit = best_layout(dump[name], reference[ref])
    if fit is None:
        raise InputError(f"the dump's {name!r} has shape {tuple(dump[name].shape)}, which "
                         f"cannot be laid out as the reference's {ref!r} "
                         f"{tuple(reference[ref].shape)}")
    return DumpMatch(name, position, ref, how, fit[0])


def _unpaired(position: int, name: str, dump: Mapping[str, torch.Tensor],
              reference: Mapping[str, torch.Tensor], ref_names: Sequence[str],
              cost: Mapping[tuple[int, int], float]) -> DumpMatch:
    options = sorted((c, j) for (i, j), c in cost.items() if i == position)
    if not options:
        return DumpMatch(name, position, "", "", None)
    closest = ref_names[options[0][1]]
    fit = best_layout(dump[name], reference[closest])
    return DumpMatch(name, position, "", "", None, closest, fit[1] if fit else None)

