"""Folding: repeated encoder layers drawn once (×N), and layout-op chains drawn as one node.

Two encoder layers fold together when they are structurally identical: the same
sequence of drawn nodes, each with the same module path inside its layer, op type,
output shape, and inputs at the same positions (or from outside the layer). Only
consecutive layers fold, so the picture keeps the order of the flow.

Example::

    >>> groups = layer_groups(records, expand=(0, -1))     # 12 identical BertLayers
    >>> [(g.first, g.last, g.count) for g in groups]
    [(0, 0, 1), (1, 10, 10), (11, 11, 1)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from introspect.errors import InputError
from introspect.render.labels import LAYOUT_OPS
from introspect.tracing.records import NodeRecord

# Layer labels of every family (introspect.tracing.shapes): BERT, DistilBERT, GPT-2, Llama.
_LAYER = re.compile(r"^(encoder\.layer|transformer\.layer|h|layers)\.(\d+)$")


@dataclass(frozen=True)
class LayerGroup:
    """Consecutive encoder layers drawn as one block (``count`` 1: drawn as itself)."""

    first: int
    last: int
    count: int
    prefix: str = "encoder.layer"  # the layers' label before the index: "h", "layers"

    @property
    def name(self) -> str:
        """``encoder.layer.3`` or ``encoder.layer.1–10`` (an en dash, as in the label)."""
        span = f"{self.first}" if self.count == 1 else f"{self.first}–{self.last}"
        return f"{self.prefix}.{span}"

    @property
    def key(self) -> str:
        """ASCII form of ``name`` for DOT ids: ``encoder.layer.1-10``."""
        return self.name.replace("–", "-")

    @property
    def label(self) -> str:
        """``encoder.layer.1–10 ×10`` for a fold, the plain layer name otherwise."""
        return self.name if self.count == 1 else f"{self.name} ×{self.count}"


def layer_index(layer: str) -> int | None:
    """3 for ``encoder.layer.3``; None for any other layer."""
    match = _LAYER.match(layer)
    return int(match.group(2)) if match else None


def module_components(module: str) -> tuple[str, ...]:
    """``cls.predictions.transform`` -> its parts, a list index kept with its list
    (``layer.0``): the module levels a drawing clusters and a summary indents."""
    parts: list[str] = []
    for part in module.strip(".").split("."):
        if not part:
            continue
        if part.isdigit() and parts:
            parts[-1] = f"{parts[-1]}.{part}"
        else:
            parts.append(part)
    return tuple(parts)


def layer_label_prefix(layer: str) -> str:
    """``h`` for ``h.3``, ``encoder.layer`` for ``encoder.layer.3`` (and for other labels)."""
    match = _LAYER.match(layer)
    return match.group(1) if match else "encoder.layer"


def layer_members(records: Sequence[NodeRecord]) -> dict[int, list[NodeRecord]]:
    """Drawn records of each encoder layer, by layer index, in graph order."""
    members: dict[int, list[NodeRecord]] = {}
    for r in records:
        index = layer_index(r.layer)
        if index is not None:
            members.setdefault(index, []).append(r)
    return dict(sorted(members.items()))


def layer_signature(members: Sequence[NodeRecord], prefix: str) -> tuple[object, ...]:
    """What makes two layers the same drawing: relative module, op type, shape, inputs."""
    position = {r.name: i for i, r in enumerate(members)}
    return tuple(
        (
            f"{r.module}.".removeprefix(prefix),
            r.op_type,
            r.shape,
            tuple(position.get(name, -1) for name in r.inputs),
        )
        for r in members
    )


def resolve_expand(expand: Iterable[int], layer_count: int) -> frozenset[int]:
    """Layer indices to keep open; negative ones count from the end (-1 is the last).

    Raises:
        InputError: an index outside the model's layers.
    """
    chosen = set()
    for index in expand:
        if not isinstance(index, int) or isinstance(index, bool):
            raise InputError(f"expand takes layer numbers; got {index!r}")
        resolved = index + layer_count if index < 0 else index
        if not 0 <= resolved < layer_count:
            raise InputError(
                f"cannot expand layer {index}: the model has {layer_count} "
                f"encoder layers (0–{layer_count - 1}, or -1 for the last)"
            )
        chosen.add(resolved)
    return frozenset(chosen)


def layer_groups(
    members: dict[int, list[NodeRecord]], *, fold: bool = True, expand: Iterable[int] = ()
) -> list[LayerGroup]:
    """Group consecutive identical layers; expanded layers and any change break a group."""
    indices = list(members)
    opened = resolve_expand(expand, len(indices)) if indices else frozenset()
    groups: list[LayerGroup] = []
    previous: tuple[object, ...] | None = None
    for position, index in enumerate(indices):
        prefix = _layer_prefix(members[index], index)
        label = layer_label_prefix(members[index][0].layer)
        signature = layer_signature(members[index], prefix)
        can_join = (
            fold
            and bool(groups)
            and previous == signature
            and position not in opened
            and position - 1 not in opened
        )
        if can_join:
            last = groups[-1]
            groups[-1] = LayerGroup(last.first, index, last.count + 1, label)
        else:
            groups.append(LayerGroup(index, index, 1, label))
        previous = signature
    return groups


def _layer_prefix(members: Sequence[NodeRecord], index: int) -> str:
    """The module path up to and including ``layer.N.`` (``bert.encoder.layer.3.``)."""
    marker = f"{layer_label_prefix(members[0].layer).rpartition('.')[2]}.{index}" \
        if members else f"layer.{index}"
    for r in members:
        head, found, _ = f"{r.module}.".partition(f"{marker}.")
        if found:
            return head + marker + "."
    return ""


def layout_chains(records: Sequence[NodeRecord]) -> dict[str, list[NodeRecord]]:
    """Chains of layout ops (view, transpose, ...) each drawn as one node.

    A chain is a run of layout nodes in which each node reads only the one before it and
    that one feeds nothing else. Returns the chains by the name of their last node.
    """
    drawn = {r.name: r for r in records}
    consumers: dict[str, int] = {}
    for r in records:
        for name in set(r.inputs):
            if name in drawn:
                consumers[name] = consumers.get(name, 0) + 1
    chain_of: dict[str, list[NodeRecord]] = {}
    chains: dict[str, list[NodeRecord]] = {}
    for r in records:
        if r.op_type not in LAYOUT_OPS:
            continue
        tensor_inputs = [name for name in r.inputs if name in drawn]
        source = tensor_inputs[0] if len(tensor_inputs) == 1 else None
        if source in chain_of and consumers.get(source) == 1:
            chain = chain_of[source]
            chains.pop(chain[-1].name)
        else:
            chain = []
        chain.append(r)
        chain_of[r.name] = chain
        chains[r.name] = chain
    return chains
