"""A FAIL named in the layer its candidate's block holds, where a weight of that block is
another layer's.

A divergence is named after the reference node it pairs with, and a node is paired by the
values of the weights it reads. A port that loads one weight of its block 2 from layer 1
(``o_proj``, ``c_proj``, ``ln_1``: an off-by-one in a key mapping) has that weight's node,
and the nodes paired around it, named in layer 1, though the fault sits in block 2, among
weights that are layer 2's. And a port whose block 5 holds layer 4's weights, as its block
4 does too, is named in layer 4, where its block 4 agrees. Both are settled here, on the
weights each block of the candidate holds (proven equal by value: ``relations``), after
the verdict, which they never change.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping

import torch

from introspect.diff.modules.evidence import ReferenceLayers
from introspect.diff.modules.paths import moved_to
from introspect.diff.records import Divergence

# a block of a stack: the path up to its index in a ModuleList ("model.layers.2")
_BLOCK = re.compile(r"^(.*?\.)?(\d+)(?=\.|$)")
LOADED_FROM = "a weight loaded from"


def named_by_block(divergence: Divergence | None, relations: Mapping[str, set[str]],
                   reference_layers: Mapping[str, str]) -> Divergence | None:
    """``divergence`` in the reference layer its candidate's block holds the weights of.

    Args:
        divergence: the verdict's first divergence (None: nothing to name).
        relations: each candidate weight -> the reference weights holding its values.
        reference_layers: each reference weight -> the layer holding it (a block of the
            stack: ``encoder.layer.1``; others are never moved to or from).

    Returns:
        The divergence, moved with a hint that names the slip, or as it was.
    """
    if divergence is None or not divergence.candidate_module \
            or LOADED_FROM in " ".join(divergence.hints):
        return divergence
    block = block_of(divergence.candidate_module)
    blocks = _held_layers(relations, reference_layers)
    layer = divergence.layer
    if block is None or block not in blocks or layer not in blocks[block]:
        return divergence  # (a block holding none of the named layer's weights: a
        # stack run out of order, named where its values come from)
    held = _majority(blocks[block])
    if held is None:
        return divergence
    slips = _slips(block, held, relations, reference_layers)
    if not slips:  # (a block cut elsewhere than the reference's holds no slip)
        return _duplicate(divergence, block, blocks, reference_layers) if held == layer \
            else divergence
    # named in the layer the block holds (moved there, or there already), with the slip
    sources = sorted({reference_layers[reference] for _, reference in slips})
    shown = "; ".join(f"{name} holds {reference}'s values" for name, reference in slips[:2])
    hint = (f"the candidate's {block} holds {held}'s weights, but its {shown}"
            f"{'; ...' if len(slips) > 2 else ''}: {LOADED_FROM} "
            f"{' and '.join(sources)} into {held}")
    return _moved(divergence, held, hint)


def _slips(block: str, held: str, relations: Mapping[str, set[str]],
           reference_layers: Mapping[str, str]) -> list[tuple[str, str]]:
    """(candidate weight, reference weight) for each weight of ``block`` holding the values
    of another layer's weight than ``held``, whose twin in ``held`` is a weight of its own
    (not one shared across layers, which the reference reads there too) that no weight of
    the candidate holds: a port whose blocks are cut elsewhere than the reference's (its
    block 3 begins with layer 2's last LayerNorm) holds every weight once, a slip holds
    one twice and its twin never."""
    anywhere = set().union(*relations.values()) if relations else set()
    found = []
    for name, references in sorted(relations.items()):
        if block_of(name) != block or len(references) != 1:
            continue
        (reference,) = references
        layer = reference_layers.get(reference)
        twin = moved_to(reference, layer, held) if layer is not None else ""
        if layer is not None and layer != held and twin in reference_layers \
                and twin not in anywhere:
            found.append((name, reference))
    return found


def block_layers(reference: torch.nn.Module) -> dict[str, str]:
    """Each reference weight in a block of its stack -> that block (``encoder.layer.1``)."""
    layers = ReferenceLayers.of(reference)
    found = {name: layers.of_module(name.rpartition(".")[0])
             for name, _ in reference.named_parameters()}
    return {name: layer for name, layer in found.items()
            if layer.startswith(f"{layers.prefix}.")}


def block_of(module: str) -> str | None:
    """The block of a stack holding ``module``: ``blocks.2`` for ``blocks.2.attn.o_proj``;
    None outside any."""
    match = _BLOCK.match(module)
    return match.group(0) if match else None


def _held_layers(relations: Mapping[str, set[str]],
                 reference_layers: Mapping[str, str]) -> dict[str, Counter[str]]:
    """Each candidate block -> how many of its weights hold each reference block's (a
    weight whose values several reference weights hold proves nothing: all-ones gains)."""
    blocks: dict[str, Counter[str]] = {}
    for name, found in relations.items():
        block = block_of(name)
        if block is None or len(found) != 1:
            continue
        (reference,) = found
        layer = reference_layers.get(reference)
        if layer is not None:
            blocks.setdefault(block, Counter())[layer] += 1
    return blocks


def _majority(counts: Counter[str]) -> str | None:
    """The layer holding over half of the counted weights; None where none does."""
    layer, count = counts.most_common(1)[0]
    return layer if 2 * count > sum(counts.values()) else None


def _duplicate(divergence: Divergence, block: str, blocks: Mapping[str, Counter[str]],
               reference_layers: Mapping[str, str]) -> Divergence:
    """A block holding the weights another block of the stack holds too, named in the
    layer at its own place in the stack, where no block holds that layer's weights."""
    layer = divergence.layer
    siblings = sorted((b for b in blocks if _stack_of(b) == _stack_of(block)), key=_index)
    held = {b: _majority(blocks[b]) for b in siblings}
    twins = [b for b in siblings if b != block and held[b] == layer]
    layers = sorted(set(reference_layers.values()), key=_index)
    if not twins or len(siblings) != len(layers):
        return divergence
    own = layers[siblings.index(block)]
    if own == layer or own in held.values():
        return divergence
    hint = (f"the candidate's {block} holds {layer}'s weights, as its {twins[0]} does, and "
            f"no block of the candidate holds {own}'s: {layer}'s weights loaded into {own}")
    return _moved(divergence, own, hint)


def _moved(divergence: Divergence, layer: str, hint: str) -> Divergence:
    return dataclasses.replace(divergence, layer=layer,
                               module=moved_to(divergence.module, divergence.layer, layer),
                               hints=(hint, *divergence.hints))


def _stack_of(block: str) -> str:
    return block.rsplit(".", 1)[0] if "." in block else ""


def _index(name: str) -> int:
    tail = name.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1


__all__ = ["LOADED_FROM", "block_layers", "block_of", "named_by_block"]
