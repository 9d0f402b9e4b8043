"""Nodes that cut one region out of a tensor: ``split``, ``chunk``, ``[..., a:b]``, ``narrow``.

A fused projection's output holds the other graph's separate outputs side by side;
these helpers find the nodes that take a given region back out of it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx

from introspect.diff.ops.align.view import GraphView
from introspect.diff.records import Region


def parts_cut(graph: GraphView, name: str, region: Region) -> list[str]:
    """Nodes that take exactly ``region`` out of node ``name`` (split, chunk, slicing)."""
    shape = graph.records[name].shape
    if shape is None:
        return []
    ndim = len(shape)
    found = []
    for user in graph.users[name]:
        node = graph.nodes[user]
        cut = _cut_of(node, shape)
        if cut is not None:
            dim, start, stop = cut
            if dim - ndim == region.dim and (start, stop) == (region.start, region.stop):
                found.append(user)
            continue
        sections = _sections_of(node, shape)
        if sections is None:
            continue
        dim, bounds = sections
        for item in graph.users[user]:
            getter = graph.nodes[item]
            if getter.target is operator.getitem and isinstance(getter.args[1], int) \
                    and getter.args[1] < len(bounds):
                start, stop = bounds[getter.args[1]]
                if dim - ndim == region.dim and (start, stop) == (region.start, region.stop):
                    found.append(item)
    return found


def _sections_of(node: torch.fx.Node,
                 shape: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]] | None:
    """(dim, [(start, stop), ...]) of a split or chunk node."""
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if name not in ("split", "chunk") or len(node.args) < 2:
        return None
    dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
    if not isinstance(dim, int):
        return None
    dim %= len(shape)
    size = shape[dim]
    how: Any = node.args[1]
    if name == "chunk" and isinstance(how, int):
        step = -(-size // how)
        sizes = [min(step, size - s) for s in range(0, size, step)]
    elif isinstance(how, int):
        sizes = [min(how, size - s) for s in range(0, size, how)]
    elif isinstance(how, (list, tuple)) and all(isinstance(s, int) for s in how):
        sizes = list(how)
    else:
        return None
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return dim, bounds


def _cut_of(node: torch.fx.Node, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(dim, start, stop) when ``node`` slices one dimension of its input and nothing else."""
    argument: Any = node.args[1] if len(node.args) > 1 else None
    if node.target is operator.getitem and isinstance(argument, (tuple, slice)):
        index: tuple[Any, ...] = argument if isinstance(argument, tuple) else (argument,)
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (len(shape) - len(index) + 1) + index[at + 1:]
        cuts = [(d, s) for d, s in enumerate(index) if s != slice(None)]
        if len(cuts) == 1 and isinstance(cuts[0][1], slice) and cuts[0][1].step in (None, 1):
            dim, s = cuts[0]
            if all(isinstance(v, (int, type(None))) for v in (s.start, s.stop)):
                start, stop, _ = s.indices(shape[dim])
                return dim, start, stop
    if node.target == "narrow" and len(node.args) == 4 and all(
            isinstance(a, int) for a in node.args[1:]):
        dim, start, length = (int(a) for a in node.args[1:])  # type: ignore[arg-type]
        return dim % len(shape), start, start + length
    return None



__all__ = ["parts_cut"]
