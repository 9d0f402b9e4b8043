"""Align a port's dumped tensors to the reference nodes that hold the same quantity.

No name map is needed. A layout change (a transpose, heads split or merged, a batch dim
of 1 dropped) only moves elements around, so a dumped tensor and its reference node hold
the same multiset of values: sorting both and comparing gives a lower bound of the error
under *any* layout, cheap enough to rule out almost every reference node of the same size.

1. **Duplicates**: dumped tensors with the same bytes are one quantity (a layer output
   saved again as the next layer's input); they pair together.
2. **By value, globally**: a dumped tensor whose values a reference node holds within
   budget (the identity layout first, another only when it brings the pair within
   budget) is paired with it, wherever it sits in the dump. These pairs are the anchors.
   When they run against the dump's order (names sorted, shuffled), the order is
   ignored, and a note says so.
3. **Regrouped quantities**: a tensor that differs from a reference node by one constant
   per feature (a projection before its bias, that ONNX Runtime adds in a fused op) is
   that quantity regrouped, reported unpaired with the reason, where the values after it
   agree (else it may be a bias left out: it is paired, and the reason is in its row).
4. **Faults**: a fault propagates to the output of its layer and to every later layer. A
   tensor with no partner by value is therefore paired with a free reference node only
   between the two value pairs around it, by a monotone alignment of the two orders, when
   the dump's order is known (each pair's distance under a ceiling; the closest first):
   after the node that the value pair just before it in the dump holds and before the one
   that the value pair just after it holds (none between them, as for a tensor between a
   quantity and its cast: unpaired, not guessed); without an order,
   only where no value pair lies at or after that node's layer output ("the fault zone"),
   with the closest free node. A tensor with no partner
   elsewhere is left unpaired and never fails the verdict by itself.

A tensor of a size no reference node has matches nothing, and says so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from introspect.errors import InputError
from introspect.spread import index_dtype

BY_NAME, BY_VALUE, BY_ORDER, BY_CLOSEST = "name", "value", "order", "closest"
_UNASSIGNED_COST = 1.0  # the cost of leaving a dumped tensor unpaired, in the DP below
ORDER_COST_CEILING = 0.75  # no pair by order or closeness farther apart than this
_SKIP_COST = 0.002  # a reference node skipped between two pairs made by order
_QUANTILES = 257  # points of each sorted tensor kept for the cheap first bound
_KEEP_SORTED = 1 << 22  # larger tensors are sorted again when needed, not kept sorted
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

    @property
    def identity(self) -> bool:
        return self.permutation == tuple(range(len(self.permutation))) \
            and self.dump_shape == self.reference_shape

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
    reason: str = ""  # unpaired: why; paired: "same values as X" for a duplicate


@dataclass
class DumpMatching:
    """Every dumped tensor's match, in the dump's order, and what to tell the user."""

    matches: list[DumpMatch]
    notes: list[str] = field(default_factory=list)
    order_used: bool = False


def best_layout(value: torch.Tensor, reference: torch.Tensor) -> tuple[Layout, float] | None:
    """The layout under which ``value`` is closest to ``reference``, and that max abs error.

    None when the two hold different numbers of elements.
    """
    if value.numel() != reference.numel():
        return None
    best: tuple[Layout, float] | None = None
    target = reference.double()
    for layout in layouts(tuple(value.shape), tuple(reference.shape)):
        error = _max_abs(layout.apply(value).double(), target)
        if best is None or error < best[1]:
            best = (layout, error)
            if error == 0.0:
                break
    return best


def layouts(dump_shape: tuple[int, ...], reference_shape: tuple[int, ...]) -> list[Layout]:
    """Every layout tried, the identity (or plain reshape) first.

    Never the one that swaps the last two dims of a value whose last two dims are equal
    (attention scores, transposed, are queries and keys swapped: a bug, not a layout).
    """
    def orders(n: int) -> list[tuple[int, ...]]:
        return list(itertools.permutations(range(n))) if n <= _MAX_PERMUTED_DIMS \
            else [tuple(range(n))]

    def square_swap(p: tuple[int, ...], shape: tuple[int, ...]) -> bool:
        n = len(p)
        return n >= 2 and shape[-1] == shape[-2] and p[n - 1] == n - 2 and p[n - 2] == n - 1

    found = [Layout(p, dump_shape, reference_shape) for p in orders(len(dump_shape))
             if not square_swap(p, dump_shape)]
    found += [Layout(p, dump_shape, reference_shape, reshape_first=True)
              for p in orders(len(reference_shape))[1:] if not square_swap(p, reference_shape)]
    return found


def identity_layout(value: torch.Tensor, reference: torch.Tensor) -> Layout:
    """The same layout (a plain reshape where the shapes differ)."""
    shape = tuple(value.shape)
    return Layout(tuple(range(len(shape))), shape, tuple(reference.shape))


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.numel():
        return 0.0
    difference = (a - b).abs()
    return math.inf if bool(difference.isnan().any()) else float(difference.max())


def _finite_view(value: torch.Tensor) -> torch.Tensor:
    """The tensor, flat, in a float dtype that sorts it without loss; non-finite as 0."""
    flat = value.detach().reshape(-1)
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()
    return torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)


class _Profile:
    """A tensor's sorted values: the lower bound of its error under any layout.

    Only tensors of a size the other side has are profiled; the full sort is kept for
    tensors up to ``_KEEP_SORTED`` elements, and redone when needed for larger ones.
    """

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        ordered = _finite_view(value).sort().values
        self.numel = ordered.numel()
        self.scale = float(ordered.abs().max()) if self.numel else 0.0
        points = torch.linspace(0, max(self.numel - 1, 0), _QUANTILES,
                                dtype=index_dtype(self.numel)).round().long()
        self.quantiles = ordered[points].double() if self.numel else torch.zeros(0)
        self._sorted = ordered if self.numel <= _KEEP_SORTED else None

    def sorted(self) -> torch.Tensor:
        return self._sorted if self._sorted is not None else \
            _finite_view(self.value).sort().values

    def quick_bound(self, other: _Profile) -> float:
        """A lower bound of the sorted bound (at a few hundred points)."""
        return _max_abs(self.quantiles, other.quantiles)

    def bound(self, other: _Profile) -> float:
        """The smallest max abs error any layout can give."""
        a, b = self.sorted(), other.sorted()
        dtype = torch.promote_types(a.dtype, b.dtype)
        return _max_abs(a.to(dtype), b.to(dtype))

    def cost(self, other: _Profile) -> float:
        """How far apart, from 0 (same values) to 1 (unrelated), from the quantiles."""
        return min(1.0, self.quick_bound(other) / (max(self.scale, other.scale) + 1e-12))


def match_dump(dump: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], *,
               ordered: bool, agrees: Callable[[str, str, torch.Tensor], bool],
               allowance: Callable[[str, str], float],
               layers: Mapping[str, str] | None = None,
               name_map: Mapping[str, str] | None = None) -> DumpMatching:
    """Pair every dumped tensor with the reference node holding the same quantity.

    Args:
        dump: the port's tensors by its own names, in the order it produced them when
            ``ordered``.
        reference: the reference's values by node name, in graph order.
        ordered: whether ``dump``'s order is the order of production.
        agrees: ``(dump name, reference node, dumped value in the node's layout) -> bool``:
            whether the two agree within the node's budget.
        allowance: ``(dump name, reference node) -> the largest error any element may
            have`` within budget (atol + rtol * the node's largest magnitude): what rules
            a pair out from its sorted values alone.
        layers: reference node -> its layer (for the fault zone); None: one layer.
        name_map: optional help: dump name -> reference node name.

    Returns:
        A ``DumpMatching``: one ``DumpMatch`` per dumped tensor, in the dump's order.

    Raises:
        InputError: a name map that names tensors or nodes that do not exist.
    """
    return _Matcher(dump, reference, ordered, agrees, allowance, layers or {},
                    _named_pairs(name_map or {}, dump, reference)).run()


class _Matcher:
    def __init__(self, dump: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor],
                 ordered: bool, agrees: Callable[[str, str, torch.Tensor], bool],
                 allowance: Callable[[str, str], float], layers: Mapping[str, str],
                 fixed: dict[str, str]) -> None:
        self.dump, self.reference = dump, reference
        self.names, self.ref_names = list(dump), list(reference)
        self.ref_index = {n: j for j, n in enumerate(self.ref_names)}
        self.ordered, self.agrees, self.allowance = ordered, agrees, allowance
        self.layers, self.fixed = layers, fixed
        self.notes: list[str] = []
        sizes: dict[int, list[int]] = {}
        for j, n in enumerate(self.ref_names):
            sizes.setdefault(reference[n].numel(), []).append(j)
        self.by_size = sizes
        self._profiles: dict[tuple[str, str], _Profile] = {}

    # -- profiles ------------------------------------------------------------------------

    def profile(self, side: str, name: str) -> _Profile:
        key = (side, name)
        if key not in self._profiles:
            value = self.dump[name] if side == "dump" else self.reference[name]
            self._profiles[key] = _Profile(value)
        return self._profiles[key]

    def same_size(self, name: str) -> list[int]:
        return self.by_size.get(self.dump[name].numel(), [])

    # -- the passes ----------------------------------------------------------------------

    def run(self) -> DumpMatching:
        groups = self._duplicates()
        representatives = [g[0] for g in groups]
        found: dict[int, tuple[int, Layout, str]] = {}  # rep position -> (ref, layout, how)
        for i in representatives:
            name = self.names[i]
            if name in self.fixed:
                ref = self.fixed[name]
                found[i] = (self.ref_index[ref], self._layout_for(name, ref), BY_NAME)
        options = {i: self._value_options(i) for i in representatives
                   if i not in found and self.same_size(self.names[i])}
        found |= self._choose(options)
        order_used = self.ordered and self._order_holds(found)
        reasons: dict[int, str] = {}  # unpaired: why; paired: what else to know
        taken = {j for j, _, _ in found.values()}
        zone = self._fault_zone(taken)
        candidates = []
        for i in representatives:
            if i in found or not self.same_size(self.names[i]):
                continue
            regrouped = self._regrouped(i)
            if regrouped is not None and not zone[regrouped[0]]:
                reasons[i] = regrouped[1]  # the values after it agree: not a fault
                continue
            if regrouped is not None:  # or a bias left out: the values after it differ
                reasons[i] = f"{regrouped[1]}, or a bias left out"
            candidates.append(i)
        # With the order: any free node between two value pairs (the order says where a
        # tensor belongs); without: only where a fault fits what the dump shows.
        free = {j for j in range(len(self.ref_names))
                if j not in taken and (zone[j] or order_used)}
        how = BY_ORDER if order_used else BY_CLOSEST
        considered: set[int] = set()
        window = self._windows(found, candidates) if order_used else {}
        for rows, columns in self._segments(found, candidates, free, order_used):
            considered |= set(rows)
            cost = {(i, j): c for i in rows for j in columns
                    if (i not in window or window[i][0] < j < window[i][1])
                    and self.dump[self.names[i]].numel()
                    == self.reference[self.ref_names[j]].numel()
                    and (c := self.profile("dump", self.names[i]).cost(
                        self.profile("ref", self.ref_names[j]))) <= ORDER_COST_CEILING}
            assigned = _monotone(rows, columns, cost) if order_used \
                else _in_reference_order(columns, cost)
            for i, j in assigned.items():
                name, ref = self.names[i], self.ref_names[j]
                layout, agreed = self._fit(name, ref)
                found[i] = (j, layout, BY_VALUE if agreed else how)
        for i in candidates:
            if i not in found:
                reasons[i] = self._why_unpaired(i, i in considered, zone, window.get(i))
        return DumpMatching(self._matches(groups, found, reasons), self.notes, order_used)

    def _duplicates(self) -> list[list[int]]:
        """Dumped tensors grouped by identical contents (dtype, shape and bytes)."""
        groups: list[list[int]] = []
        by_key: dict[tuple[object, ...], list[list[int]]] = {}
        for i, name in enumerate(self.names):
            value = self.dump[name]
            key = (value.dtype, tuple(value.shape), _fingerprint(value))
            for group in by_key.get(key, []):
                if torch.equal(self.dump[self.names[group[0]]], value):
                    group.append(i)
                    break
            else:
                group = [i]
                by_key.setdefault(key, []).append(group)
                groups.append(group)
        return groups

    def _value_options(self, i: int) -> list[tuple[int, Layout, float]]:
        """The reference nodes whose values ``i`` holds within budget: (node, layout, bound)."""
        name = self.names[i]
        mine = self.profile("dump", name)
        options = []
        for j in self.same_size(name):
            ref = self.ref_names[j]
            theirs = self.profile("ref", ref)
            allowed = self.allowance(name, ref)
            if mine.quick_bound(theirs) > allowed:
                continue
            bound = mine.bound(theirs)
            if bound > allowed:
                continue
            layout = self._agreeing_layout(name, ref)
            if layout is not None:
                options.append((j, layout, bound))
        return options

    def _agreeing_layout(self, name: str, ref: str) -> Layout | None:
        value, target = self.dump[name], self.reference[ref]
        for layout in layouts(tuple(value.shape), tuple(target.shape)):
            if self.agrees(name, ref, layout.apply(value)):
                return layout
        return None

    def _choose(self, options: Mapping[int, list[tuple[int, Layout, float]]]
                ) -> dict[int, tuple[int, Layout, str]]:
        """One node per tensor that has value partners: a sole partner first, then, of
        several, a free one, one between its neighbours' partners, the closest."""
        chosen: dict[int, tuple[int, Layout, str]] = {}
        for i, found in options.items():
            if len(found) == 1:
                chosen[i] = (found[0][0], found[0][1], BY_VALUE)
        anchors = sorted((i, j) for i, (j, _, _) in chosen.items())
        for i, found in sorted(options.items()):
            if len(found) < 2:
                continue
            before = max((j for k, j in anchors if k < i), default=-1)
            after = min((j for k, j in anchors if k > i), default=len(self.ref_names))
            taken = {j for j, _, _ in chosen.values()}
            j, layout, _ = min(found, key=lambda o: (o[0] in taken,
                                                     not (before < o[0] < after), o[2], o[0]))
            chosen[i] = (j, layout, BY_VALUE)
        return chosen

    def _order_holds(self, found: Mapping[int, tuple[int, Layout, str]]) -> bool:
        """Whether the value pairs follow the dump's order; a note when they do not."""
        sequence = [found[i][0] for i in sorted(found)]
        if not sequence:
            return True
        against = len(sequence) - _longest_increasing(sequence)
        if against > max(2, len(sequence) // 4):
            self.notes.append(
                f"{against} of the {len(sequence)} tensors paired by value come in another "
                "order than the reference computes them (names sorted or shuffled?): the "
                "dump's order was ignored; tensors without a partner by value were paired "
                "with the closest free node")
            return False
        if against:
            self.notes.append(
                f"{against} of the {len(sequence)} tensors paired by value come in another "
                "order than the reference's (the port computes them in another order): "
                "paired by value all the same")
        return True

    def _fault_zone(self, taken: set[int]) -> list[bool]:
        """Per reference node: whether a fault there fits what the dump shows.

        A fault propagates to its layer's output and on; a small one (a LayerNorm eps)
        may fade below budget here and there. A node is in the zone when its layer's output
        is not paired by value and, from that output on, fewer of the reference's nodes
        are paired by value than are not. Where
        the port's values agree again, a tensor without partner is another quantity than
        any the reference computes, not a fault.
        """
        last_of_layer: dict[str, int] = {}
        for j, n in enumerate(self.ref_names):
            last_of_layer[self.layers.get(n, "")] = j
        paired_after = [0] * (len(self.ref_names) + 1)
        for j in range(len(self.ref_names) - 1, -1, -1):
            paired_after[j] = paired_after[j + 1] + (j in taken)
        zone = []
        for n in self.ref_names:
            start = last_of_layer[self.layers.get(n, "")]
            paired = paired_after[start]
            zone.append(start not in taken and paired < len(self.ref_names) - start - paired)
        return zone

    def _segments(self, found: Mapping[int, tuple[int, Layout, str]], candidates: list[int],
                  free: set[int], order_used: bool) -> list[tuple[list[int], list[int]]]:
        """(dumped tensors, free nodes) to pair: between consecutive value pairs that keep
        both orders when the order holds, else all of them at once."""
        if not order_used:
            return [(candidates, sorted(free))]
        pairs = sorted((i, j) for i, (j, _, _) in found.items())
        chain = _increasing_chain(pairs)
        bounds = [(-1, -1), *chain, (len(self.names), len(self.ref_names))]
        segments = []
        for (pa, ja), (pb, jb) in itertools.pairwise(bounds):
            rows = [i for i in candidates if pa < i < pb]
            columns = [j for j in sorted(free) if ja < j < jb]
            if rows and columns:
                segments.append((rows, columns))
        return segments

    def _windows(self, found: Mapping[int, tuple[int, Layout, str]], candidates: list[int]
                 ) -> dict[int, tuple[int, int]]:
        """Per dumped tensor without a value partner, the reference nodes (exclusive bounds)
        the dump's order allows it: after the node that the value pair just before it in the
        dump holds, before the one that the value pair just after it holds.

        Every value pair counts here, also one off the longest increasing chain that
        ``_segments`` cuts by: a tensor between two value pairs of the same node (a
        quantity saved twice, a cast of it) or of nodes in the other order has no place
        the order justifies, and an empty window leaves it unpaired rather than guessed.
        """
        pairs = sorted((i, j) for i, (j, _, _) in found.items())
        positions = [i for i, _ in pairs]
        import bisect

        windows = {}
        for i in candidates:
            k = bisect.bisect_left(positions, i)
            low = pairs[k - 1][1] if k else -1
            high = pairs[k][1] if k < len(pairs) else len(self.ref_names)
            windows[i] = (low, high)
        return windows

    def _regrouped(self, i: int) -> tuple[int, str] | None:
        """The reference node ``i`` equals less one constant per feature (a bias), and why."""
        name = self.names[i]
        value = self.dump[name]
        mine = self.profile("dump", name)
        near = sorted((mine.cost(self.profile("ref", self.ref_names[j])), j)
                      for j in self.same_size(name))[:3]
        for _, j in near:
            ref = self.ref_names[j]
            target = self.reference[ref]
            layout = identity_layout(value, target)
            if _feature_offset(layout.apply(value), target, self.allowance(name, ref)):
                return j, (f"equals the reference's {ref} less one constant per feature "
                           "(a projection before its bias, or a fused op's partial sum)")
        return None

    def _why_unpaired(self, i: int, considered: bool, zone: Sequence[bool],
                      window: tuple[int, int] | None = None) -> str:
        name = self.names[i]
        if window is not None and window[1] - window[0] <= 1:
            low, high = (self.ref_names[j] if 0 <= j < len(self.ref_names) else
                         "(none)" for j in window)
            return (f"the dump puts it between tensors paired by value with {low} and "
                    f"{high}, and no reference node lies between these (a quantity saved "
                    "twice, or computed in another order): its place is unknown, not guessed")
        if considered and any(zone[j] for j in self.same_size(name)):
            return ("no reference node of its size left unpaired is near enough in value "
                    f"(sorted values over {ORDER_COST_CEILING:g} of their scale apart)")
        return ("its values match no reference node, and the port's later values agree with "
                "the reference's: another quantity than any the reference computes, not a "
                "fault")

    def _fit(self, name: str, ref: str) -> tuple[Layout, bool]:
        """The layout of a pair made by order: one that agrees, else the identity."""
        layout = self._agreeing_layout(name, ref)
        if layout is not None:
            return layout, True
        return self._layout_for(name, ref), False

    def _layout_for(self, name: str, ref: str) -> Layout:
        """The identity for a same-shape pair; for others, the layout closest in value."""
        value, target = self.dump[name], self.reference[ref]
        if tuple(value.shape) == tuple(target.shape):
            return identity_layout(value, target)
        fit = best_layout(value, target)
        if fit is None:
            raise InputError(f"the dump's {name!r} has shape {tuple(value.shape)}, which "
                             f"cannot be laid out as the reference's {ref!r} "
                             f"{tuple(target.shape)}")
        return fit[0]

    def _matches(self, groups: list[list[int]], found: Mapping[int, tuple[int, Layout, str]],
                 reasons: Mapping[int, str]) -> list[DumpMatch]:
        matches: list[DumpMatch | None] = [None] * len(self.names)
        for group in groups:
            first = group[0]
            for i in group:
                name = self.names[i]
                same = f"same values as {self.names[first]!r}" if i != first else ""
                reason = "; ".join(r for r in (same, reasons.get(first, "")) if r)
                if first in found:
                    j, layout, how = found[first]
                    if tuple(self.dump[name].shape) != layout.dump_shape:
                        layout = self._layout_for(name, self.ref_names[j])
                    matches[i] = DumpMatch(name, i, self.ref_names[j], how, layout,
                                           reason=reason)
                else:
                    matches[i] = self._unpaired(i, reason)
        return [m for m in matches if m is not None]

    def _unpaired(self, i: int, reason: str) -> DumpMatch:
        name = self.names[i]
        same = self.same_size(name)
        if not same:
            return DumpMatch(name, i, "", "", None, reason=reason)
        mine = self.profile("dump", name)
        _, j = min((mine.cost(self.profile("ref", self.ref_names[j])), j) for j in same)
        ref = self.ref_names[j]
        layout = self._layout_for(name, ref)
        error = _max_abs(layout.apply(self.dump[name]).double(), self.reference[ref].double())
        return DumpMatch(name, i, "", "", None, ref, error, reason)


def _fingerprint(value: torch.Tensor) -> tuple[float, ...]:
    """A cheap key that equal tensors share: a few of their values (no copy is made)."""
    flat = value.detach().reshape(-1)
    if not flat.numel():
        return ()
    picks = flat[torch.linspace(0, flat.numel() - 1, 16, dtype=index_dtype(flat.numel())).long()]
    return tuple(float(x) for x in picks.double().nan_to_num(nan=0.5))


def _feature_offset(value: torch.Tensor, other: torch.Tensor, slack: float) -> bool:
    """Whether ``other - value`` is one nonzero constant per feature (last dim) over rows."""
    if value.dim() < 2 or value.shape != other.shape or value.shape[-1] < 2:
        return False
    difference = (other.double() - value.double()).reshape(-1, value.shape[-1])
    if not bool(torch.isfinite(difference).all()) or difference.shape[0] < 2:
        return False
    offset = difference.median(dim=0).values
    spread = float((difference - offset).abs().max())
    return spread <= slack and float(offset.abs().max()) > slack


def _longest_increasing(sequence: Sequence[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting)."""
    import bisect

    tails: list[int] = []
    for x in sequence:
        k = bisect.bisect_left(tails, x)
        if k == len(tails):
            tails.append(x)
        else:
            tails[k] = x
    return len(tails)


def _named_pairs(name_map: Mapping[str, str], dump: Mapping[str, torch.Tensor],
                 reference: Mapping[str, torch.Tensor]) -> dict[str, str]:
    for name, node in name_map.items():
        if name not in dump:
            raise InputError(f"the name map names {name!r}, which the dump does not hold")
        if node not in reference:
            raise InputError(f"the name map pairs {name!r} with {node!r}, which is not a "
                             "compared node of the reference")
        if dump[name].numel() != reference[node].numel():
            raise InputError(f"the name map pairs {name!r} {tuple(dump[name].shape)} with "
                             f"{node!r} {tuple(reference[node].shape)}: not the same size")
    return dict(name_map)


def _monotone(rows: Sequence[int], columns: Sequence[int],
              cost: Mapping[tuple[int, int], float]) -> dict[int, int]:
    """The pairing of dumped tensors with reference nodes that keeps both orders: dynamic
    programming. Pairing matters most (an unpaired tensor costs ``_UNASSIGNED_COST``, a
    pair its distance, under the ceiling, so less); then closeness; a node skipped between
    two pairs costs ``_SKIP_COST``, only enough to break ties, so that a tensor that stands
    for several of the reference's ops pairs with the last of them. (Skips weighed more
    than closeness pushed a fused first tensor, ORT's EmbedLayerNormalization, onto a later
    node of its size only to skip fewer nodes: a fault blamed a layer too late.)"""
    n, m = len(rows), len(columns)
    inf = math.inf
    best = [[inf] * (m + 1) for _ in range(n + 1)]
    best[0] = [0.0] * (m + 1)
    for i in range(1, n + 1):
        best[i][0] = i * _UNASSIGNED_COST
        for j in range(1, m + 1):
            options = [best[i][j - 1] + _SKIP_COST, best[i - 1][j] + _UNASSIGNED_COST]
            pair = cost.get((rows[i - 1], columns[j - 1]))
            if pair is not None:
                options.append(best[i - 1][j - 1] + pair)
            best[i][j] = min(options)
    assigned: dict[int, int] = {}
    i, j = n, m
    while i > 0 and j > 0:
        pair = cost.get((rows[i - 1], columns[j - 1]))
        if pair is not None and best[i][j] == best[i - 1][j - 1] + pair:
            assigned[rows[i - 1]] = columns[j - 1]
            i, j = i - 1, j - 1
        elif best[i][j] == best[i - 1][j] + _UNASSIGNED_COST:
            i -= 1
        else:
            j -= 1
    return assigned


def _increasing_chain(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of (position, node) pairs whose nodes increase with position."""
    import bisect

    tails: list[int] = []  # per length, the index (into pairs) of the smallest tail
    back: list[int] = []
    for k, (_, j) in enumerate(pairs):
        at = bisect.bisect_left([pairs[t][1] for t in tails], j)
        back.append(tails[at - 1] if at else -1)
        if at == len(tails):
            tails.append(k)
        else:
            tails[at] = k
    chain: list[tuple[int, int]] = []
    k = tails[-1] if tails else -1
    while k >= 0:
        chain.append(pairs[k])
        k = back[k]
    return chain[::-1]


def _in_reference_order(columns: Sequence[int], cost: Mapping[tuple[int, int], float]
                        ) -> dict[int, int]:
    """Without an order: each free node, in the reference's order, takes the closest
    tensor left. The earliest node of a fault takes the tensor least far from it, the one
    the fault has moved least: the fault's own, more often than one it propagated to."""
    assigned: dict[int, int] = {}
    for j in columns:
        options = [(c, i) for (i, k), c in cost.items() if k == j and i not in assigned]
        if options:
            assigned[min(options)[1]] = j
    return assigned
