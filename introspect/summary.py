"""A traced graph summed up as torchinfo does: one row per module down to a depth, identical
encoder layers folded (×N, as the drawing folds them), and the totals.

``module_rows`` gives the rows (records, no text); ``summary_text`` lays them out as a
table that fits a width, for ``IntrospectGraph.summary()`` and ``introspect trace
--depth N``. Depth counts module levels as the drawing does: 1 is the big blocks
(embeddings, attention mask, each encoder layer, pooler, head modules), 2 opens those
(attention, intermediate, output), 3 opens attention (self, output).

Example::

    >>> rows = module_rows(graph.records, depth=2)
    >>> [(r.name, r.count) for r in rows][:3]
    [('inputs', 1), ('embeddings', 1), ('embeddings.word_embeddings', 1)]
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from introspect.render.fold import (
    LayerGroup,
    layer_groups,
    layer_index,
    layer_members,
    module_components,
)
from introspect.tracing.records import KIND_OUTPUT, KIND_SHAPE, KIND_TENSOR, NodeRecord

DEFAULT_DEPTH = 2


@dataclass(frozen=True)
class ModuleRow:
    """One module (or folded block of identical layers) at one level of the summary."""

    name: str  # "embeddings", "encoder.layer.0–4 ×5.attention": the path, folds marked
    level: int  # 1: a block; 2: a module inside it; ...
    nodes: int  # traced nodes inside (shape bookkeeping left out), of one layer when folded
    params: int  # parameters its nodes use, of one layer when folded
    flops: int
    output_shape: str  # the shape of the last tensor it produces
    count: int  # identical layers folded into this row (1: not folded)
    own: str = ""  # its own name, the last level of the path ("attention")


def module_path(record: NodeRecord) -> tuple[str, ...]:
    """The module levels of ``record``: its block (``embeddings``, ``encoder.layer.3``, a head
    module), then the modules inside it (``("encoder.layer.3", "attention", "self")``)."""
    if record.op == "placeholder":
        return ("inputs",)
    if record.layer == "mask":
        return ("mask",)
    if record.layer in ("embeddings", "pooler") or layer_index(record.layer) is not None:
        _, found, rest = f".{record.module}.".partition(f".{record.layer}.")
        return (record.layer, *module_components(rest)) if found else (record.layer,)
    return module_components(record.module) or (record.layer or "model",)


def module_rows(records: Sequence[NodeRecord], depth: int | None = DEFAULT_DEPTH, *,
                fold: bool = True) -> list[ModuleRow]:
    """Rows for every module down to ``depth`` levels (None: every level), in the order the
    modules first run; consecutive identical encoder layers folded into their first."""
    kept = [r for r in records if r.kind not in (KIND_SHAPE, KIND_OUTPUT)]
    groups = layer_groups(layer_members(kept), fold=fold)
    group_of: dict[int, LayerGroup] = {i: g for g in groups for i in range(g.first, g.last + 1)}
    sums: dict[tuple[str, ...], list[Any]] = {}  # path -> [nodes, params, flops, shape, count]
    for r in kept:
        path = module_path(r)
        index = layer_index(r.layer)
        count = 1
        if index is not None and index in group_of and group_of[index].count > 1:
            group = group_of[index]
            if index != group.first:
                continue  # counted once, in the first layer of its fold
            path, count = (group.label, *path[1:]), group.count
        for level in range(1, len(path) + 1 if depth is None else min(len(path), depth) + 1):
            entry = sums.setdefault(path[:level], [0, 0, 0, "", count])
            entry[0] += 1
            entry[1] += r.params
            entry[2] += r.flops
            if r.kind == KIND_TENSOR and r.shapes:
                entry[3] = r.shapes
    return [ModuleRow(".".join(path), len(path), nodes, params, flops, shape, count, path[-1])
            for path, (nodes, params, flops, shape, count) in sums.items()]


def totals(graph: Any) -> list[tuple[str, int, str]]:
    """torchinfo's closing lines, from the traced graph: (label, number, unit or remark)."""
    parameters = list(graph.gm.parameters())
    count = sum(p.numel() for p in parameters)
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in parameters})
    parameter_bytes = sum(p.numel() * p.element_size() for p in parameters)
    computed = [r for r in graph.records if r.kind == KIND_TENSOR
                and r.op not in ("placeholder", "get_attr", "output")]
    inputs = [r for r in graph.records if r.op == "placeholder"]
    shape = next((r.shape for r in inputs if r.shape), None)
    return [
        ("parameters", count, ""),
        ("trainable parameters", trainable, ""),
        ("parameter bytes", parameter_bytes, f"{human_bytes(parameter_bytes)}, "
                                             f"{'/'.join(dtypes) or 'none'}"),
        ("input bytes", sum(r.nbytes for r in inputs),
         f"{' x '.join(map(str, shape))} tokens" if shape else ""),
        ("activation bytes", sum(r.nbytes for r in computed),
         f"{human_bytes(sum(r.nbytes for r in computed))}, {len(computed)} tensors"),
        ("FLOPs", sum(r.flops for r in graph.records), ""),
        ("nodes", len(graph.records),
         f"{sum(r.kind == KIND_SHAPE for r in graph.records)} of them shape bookkeeping"),
    ]


def human_bytes(count: int) -> str:
    """``count`` bytes in decimal units, as torchinfo (``90.9 MB``)."""
    size = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} GB"


def module_table(graph: Any, width: int, depth: int | None = DEFAULT_DEPTH, *,
                 fold: bool = True) -> Any:
    """The rows as a table: each level indented, a fold marked ×N (its numbers per layer)."""
    from introspect.cli.tables import Column, table

    rows = module_rows(graph.records, depth, fold=fold)
    columns = [Column("module", 0, flex=4, min_width=16, cut="fold"),
               Column("output shape", 0, flex=2, min_width=12, cut="fold"),
               Column("nodes", justify="right"), Column("params", justify="right"),
               Column("FLOPs", justify="right")]
    cells = [("  " * (r.level - 1) + r.own, r.output_shape, f"{r.nodes:,}",
              f"{r.params:,}" if r.params else "", f"{r.flops:,}" if r.flops else "")
             for r in rows]
    folded = any(r.count > 1 for r in rows)
    title = f"{graph.title} (depth {depth if depth is not None else 'full'})"
    return table(columns, cells, width=width, title=title), folded


def totals_table(graph: Any) -> Any:
    """The totals as a small rich table: numbers right-aligned, sized from the data."""
    from rich import box
    from rich.table import Table

    grid = Table(box=box.SIMPLE_HEAD, show_header=False, show_edge=False, pad_edge=False,
                 padding=(0, 1), collapse_padding=True, title="totals", title_justify="left",
                 title_style="bold")
    rows = totals(graph)
    grid.add_column(no_wrap=True)
    grid.add_column(justify="right", no_wrap=True, min_width=max(len(f"{n:,}") for _, n, _ in rows))
    grid.add_column(overflow="fold")
    for label, number, remark in rows:
        grid.add_row(label, f"{number:,}", f"({remark})" if remark else "")
    return grid


FOLD_NOTE = "×N: N identical layers shown once; their nodes, params and FLOPs are per layer"


def summary_text(graph: Any, depth: int | None = DEFAULT_DEPTH, width: int = 100, *,
                 fold: bool = True) -> str:
    """The module table and the totals as plain text, at most ``width`` characters a line."""
    from rich.text import Text

    from introspect.cli.tables import console_for, emit

    stream = io.StringIO()
    console = console_for(stream, width)
    grid, folded = module_table(graph, console.width, depth, fold=fold)
    emit(console, grid)
    if folded:
        emit(console, Text(FOLD_NOTE))
    console.print()
    emit(console, totals_table(graph))
    return stream.getvalue()


__all__ = ["ModuleRow", "human_bytes", "module_path", "module_rows", "summary_text", "totals"]
