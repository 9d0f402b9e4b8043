"""Which reference values stand for a candidate module's inputs and output.

A candidate module is paired with the reference by what it owns first: its weights, related
to the reference's by value (the same tensor, its transpose, a block of rows of it, or a
fused tensor holding it), place it inside the reference module that owns all the related
weights (their common ancestor: its *region*). A module that owns no weights (an
activation, a pooler's ``tanh``) has the whole reference as its region. Then each of its
floating inputs, and its output, is matched by value to a tensor the reference's modules
took or returned inside that region: of the same shape, the closest, and clearly so (the
next other value at least ``CLEAR`` times as far) and near enough for its dtype. A module
with no input or no output matched so is not paired: nothing is guessed by structure.

Example::

    >>> pair = pair_call(call, boundaries, relations)
    >>> pair.reference_module, pair.inputs
    ('encoder.layer.1.output.LayerNorm', {'args.0': 'encoder.layer.1.output.dense'})
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import torch

from introspect.diff.modules.gaps import flat, largest_gap
from introspect.diff.modules.paths import depth, within
from introspect.diff.quantized import is_quantized, quantized_weights
from introspect.run.capture import Leaf, ModuleCall, picked, probe
from introspect.run.same_bytes import same_bytes
from introspect.run.truth import same_view
from introspect.spread import spread

# The next other value must be this many times as far as the chosen one.
CLEAR = 4.0
# How far (relative to the value's largest magnitude) an input may be from the reference's
# value it stands for: what a correct port's rounding, carried through the layers before,
# leaves (its dtype's drift limit, ``diff.ops.drift.DRIFT_RTOL``, 10x); and an output, which
# carries the module's own fault too.
INPUT_NEAR = {"float32": 1e-3, "float64": 1e-3, "float16": 0.2, "bfloat16": 0.3}
OUTPUT_NEAR = {"float32": 0.05, "float64": 0.05, "float16": 0.3, "bfloat16": 0.4}
_MAX_PARTS = 8  # a fused weight holds at most this many (q, k, v; gate and up; heads)
_SAMPLE = 4096  # elements compared first, to pick the few candidates compared in full
_MEASURED = 4  # the candidates compared in full, nearest on the sample first
_ROUGH = 16  # every this many of the sample bound its gap from below (``_Samples.nearest``)
_EXACT_KEY = 4096  # a weight this small is keyed by all its values
_CHUNK = 2**20  # elements cast to float32 at a time to compare two weights of other dtypes
_EXACT_IN_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)


@dataclasses.dataclass
class Boundary:
    """A value some of the reference's modules took or returned.

    ``module`` names it: the deepest module that returned it (else the first that took
    it); ``holders`` are all the modules that took or returned it (the same tensor is a
    layer's output and the next one's input)."""

    module: str
    role: str
    value: torch.Tensor
    holders: set[str] = dataclasses.field(default_factory=set)
    returned_by: set[str] = dataclasses.field(default_factory=set)
    # every boundary's sampled values, shared by all of one model's boundaries (and their
    # copies named inside a region): each is read once, not once per comparison
    samples: _Samples | None = dataclasses.field(default=None, repr=False, compare=False)
    # a leaf that returned it, whose ``grad`` the user's own backward filled (with
    # ``capture_calls(gradients=True)``; ``backward.plain_parity``)
    returned_leaf: Leaf | None = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Match:
    """A candidate value and the reference value that stands for it."""

    path: str
    boundary: Boundary
    distance: float  # largest |cand - ref|
    scale: float  # largest |ref|


@dataclasses.dataclass(frozen=True)
class ModulePair:
    """A candidate module call and the reference values that stand for its call."""

    call: ModuleCall
    region: str  # the reference module owning its related weights ("": the whole model)
    by: str  # "weights", "value" or IN_PART
    inputs: tuple[Match, ...]
    output: Match

    @property
    def reference_module(self) -> str:
        return self.output.boundary.module


# A leaf module some of whose weights hold one of the reference's each and the rest none
# (a key whose bias was left at its initial values), its output near no reference value,
# paired by those weights with their owner's output (``evidence.pair_for``): a pair that
# only a module holding it, found the reference's exactly, can settle (``cancelled``).
IN_PART = "weights, in part"


class Boundaries(list[Boundary]):
    """``reference_boundaries``' values in their order, those inside each module found by
    one lookup (every module pairing a call reads them: a scan of every holder of every
    boundary for each call cost more than the pairing). Indexed on first use; the list is
    complete by then and never changed."""

    def __init__(self, boundaries: Iterable[Boundary],
                 weights: Iterable[str] = ()) -> None:
        super().__init__(boundaries)
        self._index: tuple[dict[str, _Shaped], dict[str, _Shaped]] | None = None
        self.weights = frozenset(weights)  # the reference's parameter paths
        self._widened: dict[str, str] = {}  # (``widened``, once a region: every call asks)

    def inside(self, region: str, returned: bool = False) -> list[Boundary]:
        """``[b for b in self if a module in b.holders (b.returned_by) is inside region]``."""
        if self._index is None:
            self._index = (_by_region(self, returned=False), _by_region(self, returned=True))
        return self._index[returned].get(region, _NONE)

    def widened(self, region: str) -> str:
        """The outermost reference module around ``region`` that owns no weight outside it
        (``pooler`` around ``pooler.dense``: its tanh has none): a module owning the same
        weights may return what that module returns (``nn.Sequential(Linear, Tanh)``).
        ``region`` itself where it owns none, or the weights are not known."""
        if region not in self._widened:
            self._widened[region] = self._widen(region)
        return self._widened[region]

    def _widen(self, region: str) -> str:
        mine = self._under(region) if region else frozenset()
        if not mine:
            return region
        while region:
            parent = region.rpartition(".")[0]
            if self._under(parent) != mine:
                break
            region = parent
        return region

    def _under(self, module: str) -> frozenset[str]:
        if not module:
            return self.weights
        return frozenset(w for w in self.weights if w.startswith(f"{module}."))


class _Shaped(list[Boundary]):
    """The boundaries inside one region, those of each shape found by one lookup:
    ``closest`` asks for a shape once per candidate value, each of a thousand calls
    scanned the whole region for it."""

    def __init__(self, boundaries: Iterable[Boundary]) -> None:
        super().__init__(boundaries)
        self._by_shape: dict[tuple[int, ...], list[Boundary]] | None = None

    def floating_of_shape(self, shape: tuple[int, ...]) -> list[Boundary]:
        """``[b for b in self if b.value's shape is shape and it is floating]``, in order."""
        if self._by_shape is None:
            self._by_shape = {}
            for b in self:
                if b.value.is_floating_point():
                    self._by_shape.setdefault(tuple(b.value.shape), []).append(b)
        return self._by_shape.get(shape, [])


_NONE = _Shaped(())


def _by_region(boundaries: Iterable[Boundary], returned: bool) -> dict[str, _Shaped]:
    """Each boundary listed, in order, under every module that holds (or returned) it and
    each of their ancestors ("" too): ``within(m, region)`` for the region it is under."""
    index: dict[str, _Shaped] = {}
    for b in boundaries:
        modules = b.returned_by if returned else b.holders
        regions = {""} if modules else set()  # (a value no module returned is under none)
        for m in modules:
            parts = m.split(".") if m else []
            regions.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        for region in regions:
            held = index.get(region)
            if held is None:
                held = index[region] = _Shaped(())
            held.append(b)
    return index


def view_key(t: torch.Tensor) -> tuple[object, ...]:
    """A value by the memory it views: the same tensor, however many calls took it."""
    return (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape),
            tuple(t.stride()))


def reference_boundaries(calls: Iterable[ModuleCall]) -> Boundaries:
    """Every distinct value the reference's modules took or returned, once."""
    by_tensor: dict[tuple[object, ...], Boundary] = {}
    samples = _Samples()
    for call in calls:
        for role, leaves in (("output", call.outputs), ("input", call.inputs)):
            for leaf in leaves:
                if not leaf.unchanged():
                    continue
                t = leaf.value
                key = view_key(t)
                known = by_tensor.get(key)
                if known is None:
                    known = by_tensor[key] = Boundary(call.name, role, t, samples=samples)
                elif role == "output" and (known.role == "input"
                                           or depth(call.name) > depth(known.module)):
                    known.module, known.role = call.name, role
                known.holders.add(call.name)
                if role == "output":
                    known.returned_by.add(call.name)
                    if known.returned_leaf is None or known.returned_leaf.grad is None:
                        known.returned_leaf = leaf
    root = next((call.module for call in calls if call.name == ""), None)
    weights = [name for name, _ in root.named_parameters()] if root is not None else []
    return Boundaries(by_tensor.values(), weights)


def _named_inside(boundary: Boundary, region: str) -> Boundary:
    """``boundary`` named by the deepest module inside ``region`` that returned it (else
    that took it)."""
    inside = [m for m in boundary.returned_by if within(m, region)] or \
        [m for m in boundary.holders if within(m, region)]
    if not inside or boundary.module in inside and boundary.role == "output":
        return boundary
    name = max(inside, key=depth)
    return dataclasses.replace(boundary, module=name,
                               role="output" if name in boundary.returned_by else "input")


def relate_parameters(reference: torch.nn.Module, candidate: torch.nn.Module,
                      ) -> Relations:
    """Candidate parameter path -> the reference parameters it holds by value.

    The relations of ``introspect.diff.ops.align.weights`` read a recorded graph; module
    evidence needs none, so the same kinds are found here on the modules' own tensors:
    equal, transposed, a block of rows of the other (one head, one of q/k/v in a fused
    projection), reshaped (as it is or transposed), after casting both to the lower
    precision; an int8 weight relates to the
    float weight within one quantization step of it.
    """
    return relate_tensors(reference, _candidate_weights(candidate))


def relate_tensors(reference: torch.nn.Module,
                   tensors: Iterable[tuple[str, torch.Tensor]]) -> Relations:
    """``relate_parameters`` for any named tensors of a candidate (the slices of a stacked
    weight: ``modules.stacked``)."""
    ref = {name: t.detach() for name, t in reference.named_parameters()
           if t.is_floating_point()}
    keyed: dict[tuple[tuple[int, ...], bool, bytes], list[tuple[str, torch.Tensor]]] = {}
    for name, t in ref.items():
        for variant in _variants(t):
            keyed.setdefault(_key(variant), []).append((name, variant))

    same_memory: dict[str, str] = {}  # (``Relations.same_bytes``)

    def equal_to(value: torch.Tensor, name: str = "") -> set[str]:
        key = _key(value)
        found = set()
        for ref_name, other in keyed.get(key, []):
            how = "values" if key[1] else _equal_how(other, value)
            if how == "bytes" and name and other is ref[ref_name]:
                same_memory.setdefault(name, ref_name)
            if how is not None:
                found.add(ref_name)
        return found

    related: dict[str, set[str]] = {}
    for name, t in tensors:
        # ``t`` alone: ``keyed`` holds each reference weight and its transpose, and
        # ``t.t()`` equals ``r`` (or ``r.t()``) exactly where ``t`` equals ``r.t()`` (or
        # ``r``), their keys alike (a key's grid and values are transposed with it)
        found = equal_to(t, name)
        for variant in _variants(t) if not found else []:  # a fused projection on ours
            for block in _row_blocks(variant, ref.values()):
                found |= equal_to(block)
        if not found:  # a block of a larger reference weight (a fused QKV on their side)
            found = {r for r, rt in ref.items() if _holds_rows(rt, t)}
        if not found:  # another shape of a matrix's or a vector's values, a matrix's as
            # they are or transposed ((nh, hd, H) for an einsum, a bias as (nh, hd)):
            # ``keyed`` holds both, under their own shapes
            shapes = {tuple(v.shape) for rt in ref.values() if rt.ndim in (1, 2)
                      and rt.numel() == t.numel() for v in _variants(rt)} - {tuple(t.shape)}
            for shape in shapes:
                found |= equal_to(t.reshape(shape))
        if not found and t.dtype != torch.float32:
            found = {r for r, rt in ref.items() if rt.shape == t.shape
                     and torch.equal(rt.to(t.dtype), t.to(rt.device))}
        related[name] = found
    return Relations(related, same_memory)


class Relations(dict[str, set[str]]):
    """``relate_parameters``' answer, the weights under each candidate module found by one
    lookup (each of a thousand module calls scanned every weight for its own).

    ``same_bytes``: each candidate weight found holding a reference weight's bytes, laid
    out alike (``run.same_bytes``), by the reference weight's name: its checksum is that
    weight's at the moment of the proof, read from no memory again
    (``flow.candidate.note_edited_weights``)."""

    def __init__(self, found: Mapping[str, set[str]],
                 same_bytes: Mapping[str, str] | None = None) -> None:
        super().__init__(found)
        self.same_bytes = dict(same_bytes or {})
        self._owned: dict[str, list[set[str]]] | None = None
        self._regions: dict[str, str | None] = {}

    def owned(self, module: str) -> list[set[str]]:
        """``owned_relations(module, self)``, in the weights' order."""
        if self._owned is None:
            self._owned = {"": list(self.values())}
            for path, refs in self.items():
                parts = path.split(".")
                for n in range(1, len(parts)):  # every module holding it, not itself
                    self._owned.setdefault(".".join(parts[:n]), []).append(refs)
        return self._owned.get(module, [])

    def region(self, module: str) -> str | None:
        """``region_of`` a call of ``module``, found once per module."""
        if module not in self._regions:
            self._regions[module] = _region(self.owned(module))
        return self._regions[module]


def owned_relations(module: str, relations: Mapping[str, set[str]]) -> list[set[str]]:
    """The reference weights each weight of candidate ``module`` (and its submodules) holds
    (``relate_parameters``; "" is the whole model)."""
    if isinstance(relations, Relations):
        return relations.owned(module)
    return [refs for path, refs in relations.items()
            if path.startswith(f"{module}.") or not module]


def region_of(call: ModuleCall, prefix_params: Mapping[str, set[str]]) -> str | None:
    """The reference module owning every weight related to the call's module (its
    parameters' common ancestor); "" when it owns none; None when it owns weights of which
    none relates (nothing to stand for it)."""
    if isinstance(prefix_params, Relations):
        return prefix_params.region(call.name)
    return _region(owned_relations(call.name, prefix_params))


def _region(mine: list[set[str]]) -> str | None:
    if not mine:
        return ""
    owners = [r.rpartition(".")[0] for refs in mine for r in refs]
    if not owners:
        return None
    return common_path(owners)


def pair_call(call: ModuleCall, boundaries: Sequence[Boundary], region: str, by: str,
              dtype: str, proven: bool = False, naming: bool = False) -> ModulePair | None:
    """The reference values for ``call``'s floating inputs and its first output, or None.
    ``proven``: every weight of the module holds one of the reference's (its output may
    then be paired by them alone: ``_owned_output``). ``naming``: the outputs fail already,
    so a module some of whose weights are the reference's (a block whose other weights are
    folded) may be paired with their owner's output too: its row can only say where."""
    outputs = [leaf for leaf in call.outputs if leaf.unchanged()]
    if not outputs or not call.inputs:
        return None
    # named inside the region once chosen: ``closest`` reads a boundary's value, never its
    # name (a name for each of a thousand boundaries per call cost more than the pairing)
    inside = _in_region(boundaries, region)
    inputs = []
    for leaf in call.inputs:
        match = closest(leaf, inside, INPUT_NEAR.get(dtype, INPUT_NEAR["float32"]))
        if match is not None:
            inputs.append(_named_match(match, region))
    if not inputs:
        return None
    near = OUTPUT_NEAR.get(dtype, OUTPUT_NEAR["float32"])
    # what a reference module owning the same weights returned, around the region too
    wide = boundaries.widened(region) if isinstance(boundaries, Boundaries) else region
    output = closest(outputs[0], _in_region(boundaries, wide, returned=True), near)
    if output is None or output.distance > 0.0:
        output = _taken_instead(outputs[0], boundaries, region, near, output)
    if output is None and (proven or naming) and region:
        output = _owned_output(outputs[0], boundaries, region, near)
    if output is None:
        return None
    if wide != region and output.boundary.returned_by \
            and not any(within(m, region) for m in output.boundary.returned_by):
        # returned around the region only: named by the outermost module returning it
        # (``pooler``, not its weightless ``pooler.activation``)
        named = min((m for m in output.boundary.returned_by if within(m, wide)), key=depth)
        boundary = dataclasses.replace(output.boundary, module=named, role="output")
        return ModulePair(call, wide, by, tuple(inputs),
                          dataclasses.replace(output, boundary=boundary))
    return ModulePair(call, region, by, tuple(inputs), _named_match(output, region))


def _taken_instead(leaf: Leaf, boundaries: Sequence[Boundary], region: str, near: float,
                   returned: Match | None) -> Match | None:
    """A value a module inside ``region`` took and none returned, where it stands for
    ``leaf`` clearly nearer than ``returned`` (the nearest value returned): a port whose
    module returns a sum the reference computes between its modules (a Llama stage ending
    at the residual after attention, which the reference hands its post-attention norm)
    is paired with that sum, not with the layer's output a few percent from it, which
    would fail a correct port. ``returned`` where there is none."""
    if not region:
        return returned
    taken = [b for b in _in_region(boundaries, region) if not b.returned_by]
    found = closest(leaf, taken, near) if taken else None
    if found is None or returned is not None and not found.distance * CLEAR < returned.distance:
        return returned
    return found


def _owned_output(leaf: Leaf, boundaries: Sequence[Boundary], region: str,
                  near: float) -> Match | None:
    """The output of the reference module owning the weights of a call whose output is
    near no reference value: the one value that module returned of its shape. Its weights
    prove the pair (a NumPy LayerNorm adding its bias twice is 0.4 from every value, and
    was not judged at all). Not where the output is near some other reference value (a
    module that computes more than the one owning its weights: a Linear whose forward
    applies the GELU too)."""
    shape = tuple(leaf.value.shape)
    owned = [b for b in _in_region(boundaries, region, returned=True)
             if region in b.returned_by and tuple(b.value.shape) == shape
             and b.value.is_floating_point()]
    if len(owned) != 1 or not leaf.value.numel():
        return None
    if closest(leaf, _in_region(boundaries, "", returned=True), near) is not None:
        return None
    chosen = owned[0]
    return Match(leaf.path, chosen, distance(leaf.value, chosen.value), _scale_of(chosen))


def _in_region(boundaries: Sequence[Boundary], region: str,
               returned: bool = False) -> list[Boundary]:
    """The boundaries a module inside ``region`` took or returned (``returned``: returned),
    in their order."""
    if isinstance(boundaries, Boundaries):
        return boundaries.inside(region, returned)
    return [b for b in boundaries
            if any(within(m, region) for m in (b.returned_by if returned else b.holders))]


def _named_match(match: Match, region: str) -> Match:
    return dataclasses.replace(match, boundary=_named_inside(match.boundary, region))


def closest(leaf: Leaf, boundaries: Sequence[Boundary], near: float) -> Match | None:
    """The boundary value of ``leaf``'s shape closest to it, if clearly so and near."""
    value = leaf.value
    shape = tuple(value.shape)
    same = boundaries.floating_of_shape(shape) if isinstance(boundaries, _Shaped) else \
        [b for b in boundaries if tuple(b.value.shape) == shape and b.value.is_floating_point()]
    if not same and value.numel():  # another layout, or one row of the batch at a time
        same = _views(boundaries, shape)
    if not same or value.numel() == 0:
        return None
    exact = _equal_one(value, same, leaf.nan_free)
    if exact is not None:  # (most values of a close port): no other boundary can be nearer,
        # and none counts against it (CLEAR x 0)
        return Match(leaf.path, exact, 0.0, _scale_of(exact))
    sample = _sample_index(value.numel())
    tables = {id(b.samples) for b in same}
    measure = distance
    if len(tables) == 1 and same[0].samples is not None:  # one table: gaps in few passes
        rough = same[0].samples.nearest(value, same, sample, _MEASURED)
        measure = same[0].samples.distance
    else:
        mine = value.reshape(-1)[sample].double().cpu()
        rough = sorted(same, key=lambda b: _gap(mine, picked(b.value, sample).double().cpu()))
    first = measure(value, rough[0].value)
    if first == 0.0:  # (most values of a close port): no other boundary can be nearer,
        # and none counts against it (CLEAR x 0)
        return Match(leaf.path, rough[0], 0.0, _scale_of(rough[0]))
    measured = [(first, rough[0])] + [(measure(value, b.value), b)
                                      for b in rough[1:_MEASURED]]
    measured.sort(key=lambda m: m[0])
    best, chosen = measured[0]
    scale = _scale_of(chosen)
    if not best <= near * scale:
        return None
    others = [d for d, b in measured[1:] if measure(b.value, chosen.value) > 0]
    if others and not min(others) >= CLEAR * best:
        return None
    return Match(leaf.path, chosen, best, scale)


_MAX_VIEWS = 64  # views of the reference's values tried for one candidate value


def _views(boundaries: Sequence[Boundary], shape: tuple[int, ...]) -> list[Boundary]:
    """The reference's values laid out as a candidate value of ``shape`` that none has:
    its dimensions in another order (a port that runs sequence-first, (S, B, H)), one row
    of the batch (a port that runs its rows one at a time, with or without the batch
    dimension), a unit dimension added (its rows mapped by ``vmap``, each as a batch of
    one), or a row cut to its first positions (a row of its real tokens only). Each
    is a view named as its value; a module run on it is run on the reference's values in
    the candidate's layout, and its output held to the view its output is nearest."""
    found: list[Boundary] = []
    for boundary in boundaries:
        value = boundary.value
        if not value.is_floating_point() or not value.numel():
            continue
        for unit in range(len(shape)) if len(shape) == value.ndim + 1 else ():
            # a unit dimension added (``layer(row[None])`` mapped over the rows by vmap)
            if shape[unit] == 1 and tuple(value.unsqueeze(unit).shape) == shape:
                found.append(dataclasses.replace(boundary, value=value.unsqueeze(unit),
                                                 samples=None, returned_leaf=None))
        rows = [value] + ([value[i:i + 1] for i in range(value.shape[0])]
                          + [value[i] for i in range(value.shape[0])]
                          if value.ndim >= 2 and value.shape[0] > 1 else [])
        for row in rows:
            for view in _laid_out(row, shape):
                found.append(dataclasses.replace(boundary, value=view, samples=None,
                                                 returned_leaf=None))
                if len(found) >= _MAX_VIEWS:
                    return found
    return found


def _laid_out(value: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """``value`` as ``shape``: its dimensions permuted, then at most one of them cut to
    its first entries, never its last, its features ([]: it cannot be). The first of
    a row's features are not the row: a module taking them computes part of what the
    reference's module does (an FFN's output Linear split in two halves summed), and its
    output, a few percent from the whole, would be held to the whole as a fault."""
    if value.ndim != len(shape) or value.ndim > 4:
        return []
    laid = []
    for order in itertools.permutations(range(value.ndim)):
        sizes = [value.shape[d] for d in order]
        cut = [i for i, (a, b) in enumerate(zip(sizes, shape, strict=True)) if a != b]
        if len(cut) > 1 or (cut and sizes[cut[0]] < shape[cut[0]]) \
                or (cut and order[cut[0]] == value.ndim - 1):
            continue
        view = value.permute(order) if list(order) != sorted(order) else value
        if cut:
            view = view.narrow(cut[0], 0, shape[cut[0]])
        laid.append(view)
    return laid


def _equal_one(value: torch.Tensor, boundaries: Sequence[Boundary],
               nan_free: bool = False) -> Boundary | None:
    """The first of ``boundaries`` equal to ``value`` bit for bit (a few elements compared
    first; the capture kept a repeat as the value itself: no elements read at all, and
    not even for NaN where the capture found it free of them: ``Leaf.nan_free``)."""
    key = probe(value)
    for b in boundaries:
        known = b.samples.probe(b.value) if b.samples is not None else probe(b.value)
        if known == key and _exactly(b.value, value, nan_free):
            return b
    return None


def _exactly(a: torch.Tensor, b: torch.Tensor, nan_free: bool = False) -> bool:
    """Equal element for element, no NaN (NaN never is): a distance of 0 read from no
    float64 copy (one value held twice, ``capture``'s repeat kept as the first, reads
    nothing but its NaN, and nothing at all where it is known free of NaN)."""
    if same_view(a, b):
        return nan_free or not (a.is_floating_point() and bool(a.isnan().any()))
    if a.dtype != b.dtype or a.device != b.device or a.numel() != b.numel():
        return False
    if a.shape == b.shape:  # (no copy of a view laid out otherwise)
        return torch.equal(a, b)
    return torch.equal(a.detach().reshape(-1), b.detach().reshape(-1))


def _scale_of(boundary: Boundary) -> float:
    """``_scale`` of a boundary's value, measured once (a value stands for many calls)."""
    if boundary.samples is None:
        return _scale(boundary.value)
    return boundary.samples.scale(boundary.value)


def _scale(value: torch.Tensor) -> float:
    """The largest magnitude, NaN read as 0 (abs and max are exact in any float dtype)."""
    value = value.detach()
    largest = float(value.abs().max()) if value.numel() else 0.0
    if not math.isnan(largest):  # (NaN anywhere makes max NaN: read it as 0 then)
        return largest
    return float(value.abs().nan_to_num(0).max())


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over elements finite on both sides (inf where none is), as float64
    copies give it (``gaps``: read without them)."""
    if _exactly(a, b):
        return 0.0
    if a.numel():  # a finite largest gap: every element is finite on both sides
        largest = largest_gap(a, b)
        if math.isfinite(largest):
            return largest
    finite = torch.isfinite(flat(a)) & torch.isfinite(flat(b))
    if not bool(finite.any()):
        return 0.0 if a.numel() == 0 else math.inf
    return largest_gap(a, b, finite)


class _Samples:
    """The sampled values (float64) of every boundary of one shape, stacked: the gaps of a
    candidate value to many of them are one subtraction, as ``_gap`` measures each."""

    def __init__(self) -> None:
        # shape -> (the samples, a row each; their every ``_ROUGH``-th; row by value id)
        self.tables: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor,
                                                 dict[int, int]]] = {}
        self.kept: list[torch.Tensor] = []  # the values sampled: their ids stay theirs
        self.scales: dict[int, tuple[torch.Tensor, float]] = {}  # id -> (value, _scale)
        self.probes: dict[int, tuple[torch.Tensor, tuple[float, ...]]] = {}  # id -> (value, probe)
        # (id, id) -> (the two values, their versions, ``distance``)
        self.distances: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int, int,
                                                    float]] = {}
        self.gaps: dict[int, _Gaps] = {}  # a candidate value's id -> its gaps to the rows

    def probe(self, value: torch.Tensor) -> tuple[float, ...]:
        return _once(self.probes, value, probe)

    def scale(self, value: torch.Tensor) -> float:
        return _once(self.scales, value, _scale)

    def distance(self, a: torch.Tensor, b: torch.Tensor) -> float:
        """``distance(a, b)``, measured once per two values while neither is edited (a
        value many calls took, a layer's output, is held against the same boundaries by
        each: 2,630 distances of 1,005 pairs in a BERT-base FAIL)."""
        if id(b) < id(a):
            a, b = b, a  # (the distance is symmetric)
        key = (id(a), id(b))
        known = self.distances.get(key)
        if known is None or known[0] is not a or known[1] is not b \
                or (known[2], known[3]) != (a._version, b._version):
            known = self.distances[key] = (a, b, a._version, b._version, distance(a, b))
        return known[4]

    def nearest(self, value: torch.Tensor, same: Sequence[Boundary], sample: torch.Tensor,
                count: int) -> list[Boundary]:
        """The first ``count`` of ``same`` by their sampled gap to ``value`` (ties in their
        order): ``sorted(same, key=gap)[:count]``, reading few of the gaps in full.

        The gap over every ``_ROUGH``-th element of the sample is at most the gap over all
        of it (a subset's largest is at most the whole's; NaN reads as inf in both). Gaps
        are read in full in the order of these bounds until the next bound is over the
        ``count``-th smallest gap read: every boundary left has a gap over it, so none of
        them is among the first ``count`` (a tie with it is read in full too). Each gap is
        a largest of float64 differences, the same figure in any batch of rows: each is
        measured once per candidate value (``_Gaps``), which several calls take (a layer's
        input is its attention's, its query's, its key's and its value's)."""
        table, rough, rows = self._table(same, sample)
        known = self._gaps_of(value, sample, rough)
        index = [rows[id(b.value)] for b in same]
        bounds = [known.bounds[row] for row in index]
        order = sorted(range(len(same)), key=bounds.__getitem__)
        gaps: dict[int, float] = {}
        done = 0
        while done < len(order):
            read = sorted(gaps.values())
            if len(read) >= count and bounds[order[done]] > read[count - 1]:
                break
            batch = order[done:done + count]
            unread = list(dict.fromkeys(index[i] for i in batch if index[i] not in known.full))
            if unread:
                known.full.update(zip(unread, _largest_gaps(table[unread], known.mine),
                                      strict=True))
            gaps.update((i, known.full[index[i]]) for i in batch)
            done += len(batch)
        return [same[i] for i in sorted(gaps, key=lambda i: (gaps[i], i))[:count]]

    def _gaps_of(self, value: torch.Tensor, sample: torch.Tensor, rough: torch.Tensor,
                 ) -> _Gaps:
        """``value``'s sample and its bounds to every row of its shape's table (``rough``),
        kept while it is unedited; rows added to the table since are bounded now."""
        known = self.gaps.get(id(value))
        if known is None or known.value is not value or known.version != value._version:
            mine = value.reshape(-1)[sample].double().cpu()
            known = self.gaps[id(value)] = _Gaps(value, value._version, mine)
        if len(known.bounds) < rough.shape[0]:  # (rows are only ever added)
            known.bounds += _largest_gaps(rough[len(known.bounds):], known.mine[::_ROUGH])
        return known

    def _table(self, same: Sequence[Boundary], sample: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
        """The sampled values (float64) of every boundary of ``same``'s shape, a row each,
        the rows' every ``_ROUGH``-th column, and each value's row by its id."""
        shape = tuple(same[0].value.shape)
        table, rough, rows = self.tables.get(shape, (None, None, {}))
        missing = [b.value for b in same if id(b.value) not in rows]
        if table is None or rough is None or missing:
            known = [table] if table is not None else []
            start = len(rows)
            for i, value in enumerate(missing):
                rows[id(value)] = start + i
            stacked = torch.stack([v.reshape(-1)[sample].double().cpu() for v in missing])
            table = torch.cat([*known, stacked])
            rough = table[:, ::_ROUGH].contiguous()
            self.tables[shape] = (table, rough, rows)
            self.kept += missing
        return table, rough, rows


@dataclasses.dataclass
class _Gaps:
    """A candidate value's sample (float64) and its gaps to the rows of its shape's table:
    the bounds over every ``_ROUGH``-th element, by row, and the gaps read in full."""

    value: torch.Tensor  # (its id is only ever its own while it is kept here)
    version: int
    mine: torch.Tensor
    bounds: list[float] = dataclasses.field(default_factory=list)
    full: dict[int, float] = dataclasses.field(default_factory=dict)


_T = TypeVar("_T")


def _once(cache: dict[int, tuple[torch.Tensor, _T]], value: torch.Tensor,
          measure: Callable[[torch.Tensor], _T]) -> _T:
    """``measure(value)``, measured once per value (kept in ``cache`` by id, with the value
    itself: an id is only ever its value's while the value lives)."""
    known = cache.get(id(value))
    if known is None or known[0] is not value:
        known = cache[id(value)] = (value, measure(value))
    return known[1]


def _largest_gaps(rows: torch.Tensor, mine: torch.Tensor) -> list[float]:
    """Each row's largest |row - mine|, NaN read as inf (``_gap`` of each row)."""
    return (rows - mine).abs().nan_to_num(math.inf).amax(dim=1).tolist()


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a - b).abs().nan_to_num(math.inf)
    return float(d.max()) if d.numel() else 0.0


def _sample_index(numel: int) -> torch.Tensor:
    if numel <= _SAMPLE:
        return torch.arange(numel)
    return spread(numel, _SAMPLE)


def _candidate_weights(candidate: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    found = [(name, t.detach()) for name, t in candidate.named_parameters()
             if t.is_floating_point()]
    for path, module in candidate.named_modules():
        if is_quantized(module):
            found += [(label, value.float()) for label, value, _ in
                      quantized_weights(path, module)]
    return found


def _variants(t: torch.Tensor) -> list[torch.Tensor]:
    return [t, t.t()] if t.ndim == 2 else [t]


def _key(t: torch.Tensor) -> tuple[tuple[int, ...], bool, bytes]:
    """Shape and a few values on a grid (8 per axis), in float32: equal tensors share it,
    and it reads a few elements of a large weight, not all (equality is checked on a hit).

    -0.0 is read as 0.0, as ``torch.equal`` does. A small tensor without NaN is keyed by
    all its values: the key is the equality, marked exact, and no check is needed
    (a model's many equal biases and norms, all zeros or ones, would be compared pairwise).
    """
    if t.numel() <= _EXACT_KEY:
        values = t.detach().to(torch.float32).cpu().reshape(-1)
        if not bool(values.isnan().any()):
            return tuple(t.shape), True, (values + 0.0).contiguous().numpy().tobytes()
    sample = t.detach()
    for dim in range(sample.ndim):
        size = sample.shape[dim]
        picks = spread(size, 8, sample.device)
        sample = sample.index_select(dim, picks)
    # -0.0 read as 0.0 here too: the key of a weight equal to the reference's must be
    # the reference weight's (a -0.0 on the grid left a weight related to nothing)
    return tuple(t.shape), False, \
        (sample.to(torch.float32) + 0.0).cpu().contiguous().numpy().tobytes()


def _row_blocks(t: torch.Tensor, references: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``t`` cut into blocks of rows the size of a reference weight (a fused projection)."""
    sizes = {int(r.shape[0]) for r in references
             if r.ndim == t.ndim and r.shape[1:] == t.shape[1:] and r.shape[0] < t.shape[0]
             and t.shape[0] % r.shape[0] == 0 and t.shape[0] // r.shape[0] <= _MAX_PARTS}
    return [block for size in sizes for block in t.split(size)]


def _holds_rows(big: torch.Tensor, small: torch.Tensor) -> bool:
    if big.ndim != small.ndim or big.shape[1:] != small.shape[1:] \
            or big.shape[0] <= small.shape[0] or big.shape[0] % small.shape[0] \
            or big.shape[0] // small.shape[0] > _MAX_PARTS:
        return False
    return any(_equal(block, small) for block in big.split(small.shape[0]))


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` equal in float32, without a float32 copy of either: a large weight
    cast whole (a vocabulary's embedding) would hold a second model at the peak. The same
    bytes are equal at once, NaN included (``run.same_bytes``: a weight holding the
    reference's NaN bit for bit holds the reference's weight)."""
    return _equal_how(a, b) is not None


def _equal_how(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """``_equal``, saying how: "bytes" (the same bytes, laid out alike), "values" (equal in
    float32, other bytes or another layout), None (not equal)."""
    if a.shape != b.shape:
        return None
    if a.device != b.device:  # the candidate on a device of its own: read there in blocks
        return _equal_how_across(a, b)
    if same_bytes(a, b):  # (most weights of a port: at the memory's speed)
        return "bytes"
    if a.dtype == b.dtype and a.dtype in _EXACT_IN_FLOAT32:
        # float32 holds every value of these: the same test
        return "values" if torch.equal(a, b) else None
    if a.ndim == 0:
        return "values" if torch.equal(a.to(torch.float32), b.to(torch.float32)) else None
    rows = max(1, _CHUNK // max(1, a[:1].numel()))  # a block of rows at a time
    return "values" if all(torch.equal(x.to(torch.float32), y.to(torch.float32))
                           for x, y in zip(a.split(rows), b.split(rows), strict=True)) \
        else None


def _equal_how_across(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """``_equal_how`` of tensors on two devices: ``b`` brought to ``a``'s device a block
    of rows at a time (a weight is never held twice whole)."""
    if a.ndim == 0:
        return _equal_how(a, b.to(a.device))
    rows = max(1, _CHUNK // max(1, a[:1].numel()))
    return "values" if all(_equal_how(x, y.to(a.device)) is not None
                           for x, y in zip(a.split(rows), b.split(rows), strict=True)) \
        else None


def common_path(names: Sequence[str]) -> str:
    """The longest module path all of ``names`` lie in ("" for none in common)."""
    unique = set(names)  # a weight related to many of one value repeats its owners
    if len(unique) <= 1:
        return next(iter(unique), "")
    # the lexicographically first and last paths share exactly the prefix all share
    parts = [tuple(n.split(".")) if n else () for n in unique]
    first, last = min(parts), max(parts)
    common: list[str] = []
    for a, b in zip(first, last, strict=False):
        if a != b:
            break
        common.append(a)
    return ".".join(common)


__all__ = ["Boundaries", "Boundary", "Match", "ModulePair", "Relations", "closest", "common_path",
           "distance", "owned_relations", "pair_call", "reference_boundaries", "region_of",
           "relate_parameters", "relate_tensors", "view_key"]
