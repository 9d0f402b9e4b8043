"""Where the whole models' float64 runs part: the layer a FAIL of the whole models names.

The whole models' float64 check (``precise.whole_models_in_float64``) fails a port whose
computation no module of its own holds (a port written as functions, its GELU's constant
typed 0.7071), but it sees the outputs alone, and such a FAIL named no layer. Here both
models run again in float64, on the same inputs, in the same mode:

- the reference, with a hook on each of its layers (the embeddings, every block) keeping
  what the layer returned, once in float32 and once in float64;
- the candidate, with every value its ops return or take up from outside the run (a
  NumPy norm's result) held against those outputs as it comes, of the same shape: the
  closest stands for the candidate's value there (a port's layer output is one of the
  values it computes; nothing else of that shape is near it). A value over a longer
  sequence (a port padding it to a multiple of 8) is held by its first positions; a
  value as far from a layer's output as half its size stands for nothing there. Its
  batch rows, or its tokens, may come in another order (rows sorted by length, a
  sequence run back to front).

Before a fault the two float64 runs agree to float64's rounding, or, where the candidate
rounds in float32 where the mode does not reach (a NumPy norm in every layer), to that
rounding, which grows slowly from layer to layer; at the fault the gap grows many times.
Of the layers up to the first whose gap is over that layer's own float32 error
(``precise``'s budget: ``CONFIRM_FACTOR`` times it, plus ``CONFIRM_UNITS`` roundings of
its largest magnitude), the one where the gap grows most over every gap before it is
named. It only names a place for a FAIL decided already, never decides one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from introspect.diff.modules.evidence import ReferenceLayers
from introspect.diff.modules.gaps import kept, largest, largest_gap
from introspect.diff.modules.paths import depth
from introspect.diff.modules.precise import Unproven, float64_limit, run_model_in_float64
from introspect.diff.ops.compare.layouts import (
    fit_row_order,
    fit_token_order,
    inverse_order,
)

_FINEST = 0.1  # a gap under this share of a layer's budget is read as that share
_JUMP = 2.0  # how many times a layer's gap must grow over those before it to be named


@dataclasses.dataclass(frozen=True)
class Departure:
    """The first reference layer whose float64 output the candidate's run does not
    reproduce: ``module`` (its path), ``layer`` (as the layer table names it), how far the
    candidate's closest value is from it, and that layer's budget."""

    module: str
    layer: str
    distance: float
    limit: float
    before: float  # the largest gap of the layers before it
    in_order: bool = False  # measured with each row's features sorted (a permuted port)

    @property
    def growth(self) -> float:
        """How many times the gap grew here over every gap before it (read no finer than
        a tenth of this layer's budget)."""
        return self.distance / max(self.before, _FINEST * self.limit) if self.limit else 0.0

    @property
    def why(self) -> str:
        order = (", each row's features sorted (the candidate holds them in another "
                 "order)") if self.in_order else ""
        return (f"run again in float64{order}, the candidate's values agree with the "
                f"reference's layers before {self.layer} to {self.before:.3g}, and its "
                f"closest to {self.layer}'s output is {self.distance:.3g} from it (budget "
                f"{self.limit:.3g}: the reference's own float32 error there)")


def first_departure(reference: torch.nn.Module, candidate: torch.nn.Module,
                    ref_inputs: Mapping[str, torch.Tensor],
                    cand_inputs: Mapping[str, torch.Tensor],
                    real: torch.Tensor | None) -> Departure | None:
    """The first of the reference's layers the candidate's float64 run parts from (see the
    module's docstring); None where a run proves nothing or every layer agrees."""
    layers = ReferenceLayers.of(reference)
    watched = _layer_modules(reference, layers)
    if not watched:
        return None
    try:
        in_float32 = _layer_outputs(reference, watched, ref_inputs, in_float64=False)
        in_float64 = _layer_outputs(reference, watched, ref_inputs, in_float64=True)
    except Unproven:
        return None
    order = [name for name in in_float64 if name in in_float32
             and in_float32[name].shape == in_float64[name].shape]
    closest = _Closest({name: in_float64[name] for name in order}, real)
    try:
        run_model_in_float64(candidate, cand_inputs, islands=True, watch=closest.see)
    except Unproven:
        return None
    limits = {name: _limit(in_float32[name], in_float64[name], real) for name in order}
    sizes = {name: largest(in_float64[name], kept(in_float64[name], in_float64[name], real))
             for name in order}
    found = _located(order, closest.distance, sizes, limits, layers)
    if (found is None or found.module == order[0]) \
            and closest.in_order.get(order[0], float("inf")) <= limits[order[0]]:
        # parted at the first layer (or nowhere seen), which it holds in another order of
        # its features: a port permuting its hidden dimension throughout parts where that
        # order does not hold it
        permuted = _located(order, closest.in_order, sizes, limits, layers)
        if permuted is not None:
            return dataclasses.replace(permuted, in_order=True)
    return found


def _located(order: list[str], distances: Mapping[str, float], sizes: Mapping[str, float],
             limits: Mapping[str, float], layers: ReferenceLayers) -> Departure | None:
    """The layer the gaps ``distances`` name (``_departed``), where every layer before it
    is stood for by some value (``_standing``); else the first far one (``_first_far``)."""
    standing = _standing(order, distances, sizes)
    found = _departed(_gaps(order, standing, limits, layers))
    if found is not None and any(name not in standing
                                 for name in order[:order.index(found.module)]):
        found = None  # a layer before it stood for by nothing: it may part there
    return found if found is not None else _first_far(order, distances, standing, limits,
                                                      layers)


# A candidate value this far from a layer's output, for its largest magnitude, stands for
# nothing there: no layer's output is as far as its own size from its counterpart.
_FAR = 0.5


def _standing(order: list[str], distances: Mapping[str, float],
              sizes: Mapping[str, float]) -> dict[str, float]:
    """The gaps of the layers some candidate value stands for: its nearest within
    ``_FAR`` of the layer's largest magnitude. A layer after one stood for by nothing is
    not named (``_located``): the runs may part before it, where nothing was seen."""
    return {name: distances[name] for name in order
            if name in distances and distances[name] <= _FAR * sizes[name]}


def _first_far(order: list[str], distances: Mapping[str, float],
               standing: Mapping[str, float], limits: Mapping[str, float],
               layers: ReferenceLayers) -> Departure | None:
    """The first layer whose nearest value is far from its output (a gross fault there:
    a weight transposed, or the first layer's features in another order), where every
    layer before it is stood for within its budget; None otherwise."""
    for i, name in enumerate(order):
        if name in standing:
            if standing[name] > limits[name]:
                return None
            continue
        if name not in distances:
            return None
        before = max((standing[n] for n in order[:i]), default=0.0)
        return Departure(name, layers.of_module(name), distances[name], limits[name], before)
    return None


def _limit(in_float32: torch.Tensor, in_float64: torch.Tensor,
           real: torch.Tensor | None) -> float:
    """A layer's budget: the reference's own float32 error there (``precise``'s)."""
    keep = kept(in_float32, in_float64, real)
    error = largest_gap(in_float32.double(), in_float64, keep)
    return float64_limit(error, 0.0, largest(in_float32, keep))


def _gaps(order: list[str], distances: Mapping[str, float], limits: Mapping[str, float],
          layers: ReferenceLayers) -> list[Departure]:
    gaps: list[Departure] = []
    for name in order:
        distance = distances.get(name)
        if distance is None:  # nothing of its shape in the candidate's run
            continue
        before = max((gap.distance for gap in gaps), default=0.0)
        gaps.append(Departure(name, layers.of_module(name), distance, limits[name], before))
    return gaps


def _departed(gaps: list[Departure]) -> Departure | None:
    """Of the layers up to the first over its budget (all where none is), the one where
    the gap grows most over every gap before it (read no finer than a tenth of the
    layer's budget): before a fault the two float64 runs agree to float64's rounding,
    or to the candidate's islands' float32 rounding, which grows slowly from layer to
    layer; the fault multiplies it. None where no layer's gap grows ``_JUMP`` times."""
    over = next((i for i, gap in enumerate(gaps) if gap.distance > gap.limit), len(gaps) - 1)
    span = gaps[:over + 1]
    best = max(span, key=lambda gap: gap.growth, default=None)
    return best if best is not None and best.growth >= _JUMP else None


class _Closest:
    """Each watched reference value's nearest value of the candidate's run, as it comes
    (no value of the run is kept): as it is, and with each row's features in sorted order
    (``in_order``), which a port that permutes its hidden dimension throughout leaves
    alike."""

    def __init__(self, targets: Mapping[str, torch.Tensor], real: torch.Tensor | None,
                 ) -> None:
        self._targets = dict(targets)
        self._keep = {name: kept(t, t, real) for name, t in self._targets.items()}
        self._pads = {name: (real == 0).reshape(*real.shape, *([1] * (t.ndim - 2)))
                      for name, t in self._targets.items()
                      if real is not None and t.ndim >= 2 and t.shape[:2] == real.shape}
        self._sorted = {name: t.sort(dim=-1).values for name, t in self._targets.items()
                        if t.dim()}
        self._sorted_keep = {name: kept(t, t, real) for name, t in self._sorted.items()}
        self.distance: dict[str, float] = {}
        self.in_order: dict[str, float] = {}

    def see(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                or value.is_complex():
            return
        ordered = None
        for name, target in self._targets.items():
            if value.shape != target.shape:  # (a value over a longer sequence: its start)
                cut = _cut_to(value, target.shape)
                if cut is not None and self._see_one(name, target, cut, None) is False:
                    return
                continue
            ordered = self._see_one(name, target, value, ordered)
            if ordered is False:
                return

    def _see_one(self, name: str, target: torch.Tensor, value: torch.Tensor,
                 ordered: Any) -> Any:
        """``value`` held against layer ``name``'s ``target``; returns the value's features
        sorted (computed once per value), or False where it cannot be read."""
        try:
            gap = largest_gap(value, target, self._keep[name])
            rows = fit_row_order(value, target, self._pads.get(name)) if gap > 0 else None
            if rows is not None:  # (a port running its batch rows in another order)
                gap = min(gap, largest_gap(value.index_select(0, inverse_order(rows[0])),
                                           target, self._keep[name]))
            tokens = fit_token_order(value, target, self._pads.get(name), 1) \
                if gap > 0 and value.ndim >= 3 else None
            if tokens is not None:  # (its sequence back to front: round s)
                gap = min(gap, largest_gap(value.index_select(1, inverse_order(tokens[0])),
                                           target, self._keep[name]))
            if name in self._sorted:
                ordered = value.sort(dim=-1).values if ordered is None else ordered
                self._nearer(self.in_order, name, largest_gap(
                    ordered, self._sorted[name], self._sorted_keep[name]))
        except RuntimeError:  # a value this cannot read (a vmap level's own)
            return False
        self._nearer(self.distance, name, gap)
        return ordered

    @staticmethod
    def _nearer(found: dict[str, float], name: str, gap: float) -> None:
        if gap == gap and gap < found.get(name, float("inf")):
            found[name] = gap


def _cut_to(value: torch.Tensor, shape: torch.Size) -> torch.Tensor | None:
    """``value``'s first entries along the one axis where it is longer than ``shape`` (a
    port padding its sequence to a multiple of 8 computes each layer over the longer
    one); None where it is not ``shape`` but for that axis, or that axis is its last
    (its features: part of a row is not the row)."""
    if value.ndim != len(shape) or value.ndim < 2:
        return None
    longer = [d for d in range(value.ndim) if value.shape[d] != shape[d]]
    if len(longer) != 1 or longer[0] == value.ndim - 1 \
            or value.shape[longer[0]] < shape[longer[0]]:
        return None
    return value.narrow(longer[0], 0, shape[longer[0]])


def _layer_modules(reference: torch.nn.Module, layers: ReferenceLayers) -> list[str]:
    """The shallowest module of each of the reference's layers (the embeddings, each
    block, the pooler): what the layer table calls a layer returns what they return."""
    chosen: dict[str, str] = {}
    for name, _ in reference.named_modules():
        if not name:
            continue
        label = layers.of_module(name)
        if label in ("embeddings", "pooler") or label.startswith(f"{layers.prefix}."):
            if label not in chosen or depth(name) < depth(chosen[label]):
                chosen[label] = name
    return list(chosen.values())


def _layer_outputs(reference: torch.nn.Module, watched: list[str],
                   inputs: Mapping[str, torch.Tensor], in_float64: bool,
                   ) -> dict[str, torch.Tensor]:
    """What each watched module returned first (its first floating tensor), in the order
    they returned, from one call of ``reference`` under ``no_grad``: in float32 as it runs,
    or in float64 (``precise``'s mode, no island allowed: the truth stands on it)."""
    modules = dict(reference.named_modules())
    outputs: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Any:
        def keep(_module: Any, _args: Any, returned: Any) -> None:
            value = returned[0] if isinstance(returned, (tuple, list)) and returned \
                else getattr(returned, "last_hidden_state", returned)
            if name not in outputs and isinstance(value, torch.Tensor) \
                    and value.is_floating_point():
                outputs[name] = value.detach().clone()
        return keep

    handles = [modules[name].register_forward_hook(hook(name)) for name in watched]
    try:
        if in_float64:
            run_model_in_float64(reference, inputs)
        else:
            with torch.no_grad():
                reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                             for k, v in inputs.items()})
    except Unproven:
        raise
    except Exception as e:  # noqa: BLE001  a run that raises names nothing
        raise Unproven(type(e).__name__) from e
    finally:
        for handle in handles:
            handle.remove()
    return outputs


__all__ = ["Departure", "first_departure"]
