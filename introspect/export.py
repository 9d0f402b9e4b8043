"""Serialise an ``IntrospectGraph`` as CSV, JSON, GraphML or a text table.

Each function returns text; the CLI decides where it goes. Output is deterministic:
the same graph gives the same bytes (records in graph order, sorted JSON keys).
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from typing import Any

from introspect.csv_cells import csv_text
from introspect.graph import IntrospectGraph, summarise_layers
from introspect.tracing.records import KIND_SHAPE

JSON_SCHEMA_VERSION = 1


def nodes_csv(graph: IntrospectGraph) -> str:
    """One row per node; tuples are written as text."""
    return csv_text(graph.nodes)


def layers_csv(graph: IntrospectGraph) -> str:
    """One row per layer."""
    return csv_text(graph.layers)


def graph_json(graph: IntrospectGraph, **context: Any) -> str:
    """Nodes, layers, inputs, tokens and notes, plus any ``context`` (model, head, ...)."""
    document = {
        "schema_version": JSON_SCHEMA_VERSION,
        **context,
        "title": graph.title,
        "inputs": list(graph.input_names),
        "outputs": list(graph.output_names),
        "texts": list(graph.texts),
        "tokens": [list(row) for row in graph.tokens],
        "notes": list(graph.notes),
        "specialised_on": [asdict(d) for d in graph.decisions],
        "layers": [asdict(row) for row in summarise_layers(graph.records)],
        "nodes": [asdict(r) for r in graph.records],
    }
    return json.dumps(document, indent=1, sort_keys=False) + "\n"


def graph_graphml(graph: IntrospectGraph) -> str:
    """The networkx view (node fields, edge shapes) as GraphML."""
    import networkx as nx

    digraph = graph.to_networkx()
    for _, attributes in digraph.nodes(data=True):
        for key, value in list(attributes.items()):
            if value is None:
                attributes[key] = ""
    buffer = io.BytesIO()
    nx.write_graphml(digraph, buffer)
    return buffer.getvalue().decode("utf-8")


def nodes_table(graph: IntrospectGraph, *, include_bookkeeping: bool = False,
                width: int = 400) -> str:
    """A readable table of the nodes (rich), without shape bookkeeping unless asked.

    The table takes its natural width (up to ``width``): names are never cut.
    """
    from rich.console import Console
    from rich.table import Table

    records = [r for r in graph.records if include_bookkeeping or r.kind != KIND_SHAPE]
    hidden = len(graph.records) - len(records)
    table = Table(title=graph.title, title_justify="left", show_lines=False)
    for column, justify in (("#", "right"), ("node", "left"), ("op", "left"), ("layer", "left"),
                            ("module", "left"), ("shape", "left"), ("params", "right"),
                            ("FLOPs", "right")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for r in records:
        table.add_row(str(r.index), r.name, r.op_type, r.layer, r.module,
                      r.shapes or r.value, f"{r.params:,}" if r.params else "",
                      f"{r.flops:,}" if r.flops else "")
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(table)
    if hidden:
        console.print(f"{hidden} shape-bookkeeping nodes (ints, sizes) hidden; "
                      "--all shows them")
    for note in graph.notes:
        console.print(f"note: {note}")
    text: str = console.file.getvalue()  # type: ignore[attr-defined]
    return text
