"""Reference weights held as slices of one candidate Parameter (a flat buffer of weights).

A port that keeps every weight in one flat ``nn.Parameter`` and views each weight out of
it holds no reference weight whole, so no weight's gradient pairs by the whole-tensor
relations; a weight whose view is cut from ``.data`` (no gradient reaches it) then passed
on node gradients (probe round g). Here each reference weight is looked for as a
contiguous run of a candidate Parameter's elements, bit for bit: found at exactly one place
in all of them (and held whole by none), that slice is its pair, proven as a whole weight
is, and the slice of the candidate Parameter's gradient is its gradient.

The search reads each candidate Parameter once: each reference weight is probed by its
largest-magnitude element (rarely repeated), every place that value sits is a start to
check, and a weight whose probe sits at too many places (a constant weight: LayerNorm
gains at 1, zero biases) is not looked for: it could be anywhere.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

# A probe value found at more places than this in one Parameter names no one place.
MAX_PLACES = 64


@dataclasses.dataclass(frozen=True)
class Slice:
    """Reference weight ``reference`` is ``candidate``'s elements ``[start, start + n)``."""

    reference: str
    candidate: str
    start: int

    def of(self, value: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The slice of ``value`` (the candidate Parameter's, or its gradient) laid out as
        the reference weight."""
        return value.reshape(-1)[self.start:self.start + math.prod(shape)].reshape(shape)


def find_slices(reference: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor],
                wanted: set[str]) -> dict[str, Slice]:
    """Each of ``wanted`` (reference weight names) found at exactly one place as a slice
    of a candidate Parameter larger than it, by name."""
    places: dict[str, list[Slice]] = {name: [] for name in wanted}
    probes = {name: _probe(reference[name]) for name in wanted}
    for cand_name, param in candidate.items():
        flat = param.detach().reshape(-1)
        looked = [n for n, p in probes.items() if p is not None
                  and reference[n].dtype == param.dtype and reference[n].numel() < flat.numel()]
        if not looked:
            continue
        by_value: dict[float, list[str]] = {}
        for name in looked:
            by_value.setdefault(float(probes[name][1]), []).append(name)  # type: ignore[index]
        values = torch.tensor(list(by_value), dtype=flat.dtype)
        hits = torch.isin(flat, values).nonzero().reshape(-1)  # one read for every probe
        at: dict[float, list[int]] = {}
        for hit, value in zip(hits.tolist(), flat[hits].tolist(), strict=True):
            at.setdefault(value, []).append(hit)
        for value, names in by_value.items():
            starts = at.get(value, [])
            for name in names:
                if len(starts) > MAX_PLACES:  # a value this common could start anywhere
                    places[name].extend([Slice(name, cand_name, -1)] * 2)
                    continue
                offset, _ = probes[name]  # type: ignore[misc]
                weight = reference[name].detach().reshape(-1)
                for hit in starts:
                    start = hit - offset
                    if 0 <= start <= flat.numel() - weight.numel() \
                            and torch.equal(flat[start:start + weight.numel()], weight):
                        places[name].append(Slice(name, cand_name, start))
    return {name: found[0] for name, found in places.items() if len(found) == 1}


def _probe(weight: torch.Tensor) -> tuple[int, torch.Tensor] | None:
    """The weight's largest-magnitude element (its flat offset, its value); None for a
    weight of one value throughout, or not finite."""
    flat = weight.detach().reshape(-1)
    if flat.numel() < 2 or not bool(torch.isfinite(flat).all()) \
            or bool((flat == flat[0]).all()):
        return None
    offset = int(flat.abs().argmax())
    return offset, flat[offset]


__all__ = ["MAX_PLACES", "Slice", "find_slices"]
