"""A FAIL named in the layer a stacked weight's slice stands for, where a slice holds
another layer's values.

A port written after a JAX/Flax scan holds each weight of every layer in one tensor with a
leading layer axis (``wo[i]`` is layer i's) and runs a loop over it: it has no module per
layer, so ``modules.blocks`` finds no block to name. A slice loaded from the layer before
(``wo[2]`` holding layer 1's values) has its nodes paired with layer 1's, where the FAIL
was named (probe round l). Here the slices are related to the reference's weights by
value, after a FAIL only, and each index of the stack stands for a block: the majority
of its slices says which layer it holds, and a slice holding another layer's weight whose
twin no weight of the candidate holds is a slip, as in ``modules.blocks``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

import torch

from introspect.diff.modules.blocks import LOADED_FROM, majority, moved, stack_index
from introspect.diff.modules.pairing import relate_tensors
from introspect.diff.modules.paths import moved_to
from introspect.diff.records import Divergence


def named_by_stacked_slices(divergence: Divergence | None, reference: torch.nn.Module,
                            candidate: torch.nn.Module, relations: Mapping[str, set[str]],
                            reference_layers: Mapping[str, str]) -> Divergence | None:
    """``divergence`` in the layer whose index in the candidate's stacked weights holds a
    slice loaded from the layer it is named in (or holds that layer's weights again).

    Args:
        divergence: the verdict's first divergence (None: nothing to name).
        reference: the reference model, whose weights the slices are related to.
        candidate: the candidate model.
        relations: each candidate weight -> the reference weights holding its values (a
            stacked weight relates to none).
        reference_layers: each reference weight -> the layer holding it.

    Returns:
        The divergence, moved with a hint that names the slip, or as it was.
    """
    layers = sorted(set(reference_layers.values()), key=stack_index)
    if divergence is None or not isinstance(candidate, torch.nn.Module) \
            or LOADED_FROM in " ".join(divergence.hints):
        return divergence
    stacked = [(name, p.detach()) for name, p in candidate.named_parameters()
               if p.is_floating_point() and p.ndim >= 2 and p.shape[0] == len(layers)
               and not relations.get(name)]
    if len(layers) < 2 or not stacked:
        return divergence
    slices = relate_tensors(reference, [(f"{name}[{i}]", p[i]) for name, p in stacked
                                        for i in range(len(layers))])
    held = _held_by_index(slices, reference_layers)
    anywhere = set().union(*relations.values(), *slices.values())
    found = {i: _slips(i, layer, slices, reference_layers, anywhere)
             for i, layer in held.items() if layer is not None}
    return _named(divergence, layers, held, found, reference_layers)


def _held_by_index(slices: Mapping[str, set[str]], reference_layers: Mapping[str, str],
                   ) -> dict[int, str | None]:
    """Each index of the stack -> the layer over half of its slices hold (None: none)."""
    counts: dict[int, Counter[str]] = {}
    for name, found in slices.items():
        layer = reference_layers.get(next(iter(found))) if len(found) == 1 else None
        if layer is not None:  # (values several weights hold prove nothing: all-ones gains)
            counts.setdefault(_slice_index(name), Counter())[layer] += 1
    return {i: majority(c) for i, c in counts.items()}


def _slips(index: int, layer: str, slices: Mapping[str, set[str]],
           reference_layers: Mapping[str, str], anywhere: set[str]) -> list[tuple[str, str]]:
    """(slice, reference weight) for each slice at ``index`` holding another layer's weight
    than ``layer`` whose twin in ``layer`` no weight of the candidate holds."""
    found = []
    for name, references in sorted(slices.items()):
        if _slice_index(name) != index or len(references) != 1:
            continue
        (reference,) = references
        source = reference_layers.get(reference)
        twin = moved_to(reference, source, layer) if source is not None else ""
        if source not in (None, layer) and twin in reference_layers and twin not in anywhere:
            found.append((name, reference))
    return found


def _named(divergence: Divergence, layers: list[str], held: Mapping[int, str | None],
           found: Mapping[int, list[tuple[str, str]]],
           reference_layers: Mapping[str, str]) -> Divergence:
    """The divergence named where the stack's slips put it (see the module's doc)."""
    named = divergence.layer
    here = [slip for i, slips in found.items() if held[i] == named for slip in slips]
    if here:  # a slip into the named layer: named there already, with the slip
        return moved(divergence, named, _hint(here, named, reference_layers))
    into = {str(held[i]): slips for i, slips in found.items()
            if any(reference_layers[reference] == named for _, reference in slips)}
    if len(into) == 1:  # a slip from the named layer, whose nodes it was paired with
        ((layer, slips),) = into.items()
        return moved(divergence, layer, _hint(slips, layer, reference_layers))
    # a whole index loaded from another layer: it holds the weights another index holds
    # too (the named layer's, or named outside the stack: its nodes paired by guess), and
    # no index holds the layer at its own place
    own = [i for i, layer in held.items() if layer is not None and i < len(layers)
           and layer != layers[i]
           and layers[i] not in held.values()
           and sum(other == layer for other in held.values()) == 2]
    if len(own) == 1 and (held[own[0]] == named or named not in layers):
        (i,) = own
        twin = str(held[i])
        hint = (f"the candidate's stacked weights hold {twin}'s at index {i}, as at index "
                f"{layers.index(twin)}, and none holds {layers[i]}'s: {twin}'s weights "
                f"loaded into {layers[i]}")
        found_here = moved(divergence, layers[i], hint)
        return found_here if named in layers else dataclasses.replace(  # (from outside the
            found_here, module=layers[i], detail="")  # stack: none of its modules)
    return divergence


def _hint(slips: list[tuple[str, str]], layer: str, reference_layers: Mapping[str, str],
          ) -> str:
    sources = sorted({reference_layers[reference] for _, reference in slips})
    shown = "; ".join(f"{name} holds {reference}'s values" for name, reference in slips[:2])
    return (f"the candidate's stacked weights hold {layer}'s at this index, but {shown}"
            f"{'; ...' if len(slips) > 2 else ''}: {LOADED_FROM} {' and '.join(sources)} "
            f"into {layer}")


def _slice_index(name: str) -> int:
    """``2`` for ``wo[2]``."""
    return int(name[name.rindex("[") + 1:-1])


__all__ = ["named_by_stacked_slices"]
