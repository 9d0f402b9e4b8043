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
from collections.abc import Callable, Iterator, Mapping

import torch

from introspect.diff.modules.evidence import ReferenceLayers
from introspect.diff.modules.paths import moved_to
from introspect.diff.records import Divergence

_NUMBERED = re.compile(r"^([A-Za-z_]+)(\d+)$")  # a module named with its index ("layer4")
_STACKED = 4  # so many modules of one name and another index make a stack (not w1-w3)
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
    stacks = _stacks(relations)
    unit_of = _unit_finder(relations, reference_layers, stacks)
    block = unit_of(divergence.candidate_module)
    blocks = _held_layers(relations, reference_layers, unit_of)
    layer = divergence.layer
    if block is None or block not in blocks or layer not in blocks[block]:
        return divergence  # (a block holding none of the named layer's weights: a
        # stack run out of order, named where its values come from)
    held = majority(blocks[block])
    if held is None:
        return divergence
    slips = _slips(block, held, relations, reference_layers, unit_of)
    swaps = [] if slips else _swaps(block, held, relations, reference_layers, unit_of, blocks)
    if swaps:  # (named where it is: the first of the two blocks to run computes wrong)
        name, reference, other_name, twin = swaps[0]
        between = sorted({held, reference_layers[reference]}, key=stack_index)
        more = f" ({len(swaps)} weights so)" if len(swaps) > 1 else ""
        hint = (f"weights swapped between {between[0]} and {between[1]}{more}: the "
                f"candidate's {name} holds {reference}'s values, and its {other_name} "
                f"holds {twin}'s")
        return moved(divergence, layer, hint)
    if not slips and held == layer:
        return _duplicate(divergence, block, blocks, reference_layers, stacks)
    if not slips and block == block_of(block, stacks):  # (a block cut elsewhere than the
        # reference's: its slots tell)
        return _by_slot(divergence, block, relations, reference_layers, stacks)
    if not slips:
        return divergence
    # named in the layer the block holds (moved there, or there already), with the slip
    sources = sorted({reference_layers[reference] for _, reference in slips})
    shown = "; ".join(f"{name} holds {reference}'s values" for name, reference in slips[:2])
    hint = (f"the candidate's {block} holds {held}'s weights, but its {shown}"
            f"{'; ...' if len(slips) > 2 else ''}: {LOADED_FROM} "
            f"{' and '.join(sources)} into {held}")
    return moved(divergence, held, hint)


def _slips(block: str, held: str, relations: Mapping[str, set[str]],
           reference_layers: Mapping[str, str], unit_of: Callable[[str], str | None],
           ) -> list[tuple[str, str]]:
    """(candidate weight, reference weight) for each weight of ``block`` holding the values
    of another layer's weight than ``held``, whose twin in ``held`` is a weight of its own
    (not one shared across layers, which the reference reads there too) that no weight of
    the candidate holds: a port whose blocks are cut elsewhere than the reference's (its
    block 3 begins with layer 2's last LayerNorm) holds every weight once, a slip holds
    one twice and its twin never."""
    anywhere = set().union(*relations.values()) if relations else set()
    return [(name, reference) for name, reference, _, twin
            in _foreign(block, held, relations, reference_layers, unit_of)
            if twin in reference_layers and twin not in anywhere]


def _foreign(block: str, held: str, relations: Mapping[str, set[str]],
             reference_layers: Mapping[str, str], unit_of: Callable[[str], str | None],
             ) -> Iterator[tuple[str, str, str, str]]:
    """(candidate weight, reference weight, its layer, its twin in ``held``) for each
    weight of ``block`` holding one weight of another layer than ``held``, by name."""
    for name, references in sorted(relations.items()):
        if unit_of(name.rpartition(".")[0]) != block or len(references) != 1:
            continue
        (reference,) = references
        layer = reference_layers.get(reference)
        if layer is not None and layer != held:
            yield name, reference, layer, moved_to(reference, layer, held)


def _swaps(block: str, held: str, relations: Mapping[str, set[str]],
           reference_layers: Mapping[str, str], unit_of: Callable[[str], str | None],
           blocks: Mapping[str, Counter[str]]) -> list[tuple[str, str, str, str]]:
    """(candidate weight, reference weight, the other candidate weight, its reference
    weight) for each weight of ``block`` holding another layer's values whose twin in
    ``held`` is held by a weight of the block that holds that other layer: two blocks that
    traded a weight (a loader's two keys crossed), which ``_slips`` leaves out since both
    twins are held once. A block cut elsewhere than the reference's trades nothing: its
    stage holds the layer before's norm, and the next stage holds its own."""
    holders: dict[str, list[str]] = {}
    for name, found in relations.items():
        if len(found) == 1:
            holders.setdefault(next(iter(found)), []).append(name)
    found_swaps = []
    for name, reference, layer, twin in _foreign(block, held, relations, reference_layers,
                                                 unit_of):
        for other_name in holders.get(twin, []):
            other = unit_of(other_name.rpartition(".")[0])
            if other not in (None, block) and other in blocks \
                    and majority(blocks[other]) == layer:
                found_swaps.append((name, reference, other_name, twin))
    return found_swaps


def block_layers(reference: torch.nn.Module) -> dict[str, str]:
    """Each reference weight in a block of its stack -> that block (``encoder.layer.1``)."""
    layers = ReferenceLayers.of(reference)
    found = {name: layers.of_module(name.rpartition(".")[0])
             for name, _ in reference.named_parameters()}
    return {name: layer for name, layer in found.items()
            if layer.startswith(f"{layers.prefix}.")}


def block_of(module: str, stacks: frozenset[str] = frozenset()) -> str | None:
    """The block of a stack holding ``module``: ``blocks.2`` for ``blocks.2.attn.o_proj``
    (an index in a ModuleList or Sequential), or ``layer4`` for ``layer4.fc1`` where
    ``layer`` is one of ``stacks`` (``_stacks``); None outside any."""
    parts = module.split(".") if module else []
    for end, part in enumerate(parts, start=1):
        if part.isdigit() or _stack_of(".".join(parts[:end])) in stacks \
                and _NUMBERED.match(part):
            return ".".join(parts[:end])
    return None


def _stacks(relations: Mapping[str, set[str]]) -> frozenset[str]:
    """The stacks whose blocks are modules named with their index (``layer0``, ``layer1``,
    ...; ``blocks.block_0``, ...): a path and name held with ``_STACKED`` indices or more."""
    indices: dict[str, set[str]] = {}
    for name in relations:
        parts = name.split(".")[:-1]
        for end, part in enumerate(parts, start=1):
            numbered = _NUMBERED.match(part)
            if numbered:
                indices.setdefault(_stack_of(".".join(parts[:end])), set()).add(
                    numbered.group(2))
    return frozenset(stack for stack, found in indices.items() if len(found) >= _STACKED)


def _unit_finder(relations: Mapping[str, set[str]], reference_layers: Mapping[str, str],
                 stacks: frozenset[str]) -> Callable[[str], str | None]:
    """``block_of``, one module deeper inside the blocks of a stack whose blocks hold no
    one layer's weights, most of them (modules holding two layers each: ``pairs.1.first``
    and ``pairs.1.second``, probe round l; a block whose two halves hold one layer, a
    slip's, is split as its stack is)."""
    blocks = _held_layers(relations, reference_layers, lambda m: block_of(m, stacks))
    mixed: Counter[str] = Counter()
    for b, counts in blocks.items():
        mixed[_stack_of(b)] += 1 if majority(counts) is None else -1
    split = {stack for stack, count in mixed.items() if count > 0}

    def unit_of(module: str) -> str | None:
        block = block_of(module, stacks)
        if block is None or _stack_of(block) not in split:
            return block
        inner = module[len(block) + 1:].split(".")[0] if module != block else ""
        return f"{block}.{inner}" if inner else None
    return unit_of


def _held_layers(relations: Mapping[str, set[str]], reference_layers: Mapping[str, str],
                 unit_of: Callable[[str], str | None]) -> dict[str, Counter[str]]:
    """Each candidate block (``unit_of``) -> how many of its weights hold each reference
    block's (a weight whose values several reference weights hold proves nothing:
    all-ones gains), the blocks in the order of their first weight."""
    blocks: dict[str, Counter[str]] = {}
    for name, found in relations.items():
        block = unit_of(name.rpartition(".")[0])
        if block is None or len(found) != 1:
            continue
        (reference,) = found
        layer = reference_layers.get(reference)
        if layer is not None:
            blocks.setdefault(block, Counter())[layer] += 1
    return blocks


def majority(counts: Counter[str]) -> str | None:
    """The layer holding over half of the counted weights; None where none does."""
    layer, count = counts.most_common(1)[0]
    return layer if 2 * count > sum(counts.values()) else None


def _duplicate(divergence: Divergence, block: str, blocks: Mapping[str, Counter[str]],
               reference_layers: Mapping[str, str], stacks: frozenset[str]) -> Divergence:
    """A block holding the weights another block of the stack holds too, named in the
    layer at its own place in the stack, where no block holds that layer's weights (the
    blocks by their index; those within one block by the order of their weights)."""
    layer = divergence.layer
    order = {b: n for n, b in enumerate(blocks)}
    stack = _stack_of(block_of(block, stacks) or block)
    siblings = sorted((b for b in blocks if _stack_of(block_of(b, stacks) or b) == stack),
                      key=lambda b: (stack_index(block_of(b, stacks) or b), order[b]))
    held = {b: majority(blocks[b]) for b in siblings}
    twins = [b for b in siblings if b != block and held[b] == layer]
    layers = sorted(set(reference_layers.values()), key=stack_index)
    if not twins or len(siblings) != len(layers):
        return divergence
    own = layers[siblings.index(block)]
    if own == layer or own in held.values():
        return divergence
    hint = (f"the candidate's {block} holds {layer}'s weights, as its {twins[0]} does, and "
            f"no block of the candidate holds {own}'s: {layer}'s weights loaded into {own}")
    return moved(divergence, own, hint)


def _by_slot(divergence: Divergence, block: str, relations: Mapping[str, set[str]],
             reference_layers: Mapping[str, str], stacks: frozenset[str]) -> Divergence:
    """A block cut elsewhere than the reference's layers holds each weight at a slot whose
    layer follows its index alike in every block (a stage's ``prev_norm`` holds the layer
    before's last LayerNorm): a weight of the named layer at a slot where the other blocks
    hold another layer than it does, its twin there held by no weight, is a slip, and the
    divergence is named in the layer the slot holds."""
    layer = divergence.layer
    by_index = {stack_index(name): name for name in set(reference_layers.values())}
    held = set().union(*relations.values())
    for name, found in sorted(relations.items()):
        module = name.rpartition(".")[0]
        if len(found) != 1 or block_of(module, stacks) != block:
            continue
        (reference,) = found
        if reference_layers.get(reference) != layer:
            continue
        slot = name[len(block):]
        offset = _slot_offset(slot, block, relations, reference_layers, stacks)
        if offset is None or by_index.get(stack_index(block) + offset) in (None, layer):
            continue
        expected = by_index[stack_index(block) + offset]
        twin = moved_to(reference, layer, expected)
        if twin in reference_layers and twin not in held:
            hint = (f"the candidate's {name} holds {reference}'s values, where its other "
                    f"blocks' {slot.lstrip('.')} holds {_shift(offset)} (here "
                    f"{expected}): {LOADED_FROM} {layer} into {expected}")
            return moved(divergence, expected, hint)
    return divergence


def _slot_offset(slot: str, block: str, relations: Mapping[str, set[str]],
                 reference_layers: Mapping[str, str], stacks: frozenset[str]) -> int | None:
    """How many layers after its block's index the other blocks of the stack hold the
    weight at ``slot`` (``.prev_norm.weight``: -1), where over half of them agree."""
    offsets: Counter[int] = Counter()
    for name, found in relations.items():
        if not name.endswith(slot) or len(found) != 1:
            continue
        other = name[:-len(slot)]
        if other == block or _stack_of(other) != _stack_of(block) \
                or block_of(other, stacks) != other:
            continue
        layer = reference_layers.get(next(iter(found)))
        if layer is not None:
            offsets[stack_index(layer) - stack_index(other)] += 1
    if not offsets:
        return None
    offset, count = offsets.most_common(1)[0]
    return offset if 2 * count > sum(offsets.values()) else None


def _shift(offset: int) -> str:
    """Which layer a slot holds, from its block's: "their own layer's", "the layer's
    before their own"."""
    if offset == 0:
        return "their own layer's"
    return f"the layer's {abs(offset)} {'after' if offset > 0 else 'before'} their own" \
        if abs(offset) > 1 else f"the layer's {'after' if offset > 0 else 'before'} their own"


def moved(divergence: Divergence, layer: str, hint: str) -> Divergence:
    """Named in ``layer``, the slip first among its hints; the hints it disproves left out
    (a weight "left unloaded" that holds another layer's values, "layers out of order"
    where one weight is another layer's: probe round l)."""
    kept = tuple(h for h in divergence.hints
                 if "left unloaded" not in h and not h.startswith(_OUT_OF_ORDER))
    return dataclasses.replace(divergence, layer=layer,
                               module=moved_to(divergence.module, divergence.layer, layer),
                               hints=(hint, *kept))


_OUT_OF_ORDER = "layers out of order"


def _stack_of(block: str) -> str:
    """The stack a block is one of: its path without its index ("blocks." for "blocks.2",
    "layer" for "layer4")."""
    return block.rstrip("0123456789")


def stack_index(name: str) -> int:
    """A block's (or layer's) index in its stack; -1 for none."""
    digits = name[len(name.rstrip("0123456789")):]
    return int(digits) if digits else -1


__all__ = ["LOADED_FROM", "block_layers", "block_of", "majority", "moved", "named_by_block",
           "stack_index"]
