"""Trace a BERT with torch.fx and list every node with its shapes.

Examples:
  introspect trace                                  # table of the embedded MiniLM
  introspect trace --head sequence-classification --format csv -o nodes.csv
  introspect trace --model bert-base --text "I love cats!" --format json -o graph.json
  introspect trace --format graphml -o graph.graphml   # for networkx, Gephi, yEd

--format table prints a table that fits the terminal (or writes it whole to -o FILE);
csv, json and graphml go to -o FILE, or to stdout without -o or with -o -. --layers
lists one row per layer instead of one per node (table and csv). Texts longer than the
model's maximum positions (512 tokens) are truncated, with a notice.
"""

from __future__ import annotations

import argparse
from typing import Any

from introspect.cli.options import add_model_options, add_verbosity_options, check_texts, say

FORMATS = ("table", "csv", "json", "graphml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--format", default="table", choices=FORMATS,
                        help="table (default), csv, json or graphml")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write here instead of stdout ('-': stdout)")
    parser.add_argument("--layers", action="store_true", help="one row per layer (table, csv)")
    parser.add_argument("--all", action="store_true",
                        help="table: also show shape-bookkeeping nodes (ints, sizes)")
    add_verbosity_options(parser)


def run(args: argparse.Namespace) -> int:
    from introspect.cli.outputs import check_outputs, is_stdout, write_output

    check_texts(args.text)
    check_outputs({"-o": args.output})  # fail before the slow part
    graph = trace_graph(args)
    if args.format == "table" and (not args.output or is_stdout(args.output)):
        print_table(graph, args)
    else:
        write_output(args.output or "-", render_trace(graph, args))
    return 0


def trace_graph(args: argparse.Namespace) -> Any:
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.graph import trace

    loaded, inputs = load_model_and_inputs(args)
    with step(args, "tracing and propagating shapes"):
        graph = trace(loaded.model, inputs, title=f"{args.model} {args.head} ({args.attn})")
    for note in graph.notes if args.verbose else ():  # layers traced in full, the mask
        say(args, note)
    return graph


def render_trace(graph: Any, args: argparse.Namespace) -> str:
    """The graph as text in --format (a table written to a file keeps every column whole)."""
    from introspect import export

    if args.format == "csv":
        return export.layers_csv(graph) if args.layers else export.nodes_csv(graph)
    if args.format == "json":
        return export.graph_json(graph, model=str(args.model), head=args.head, attn=args.attn)
    if args.format == "graphml":
        return export.graph_graphml(graph)
    if args.layers:
        return str(graph.layers.to_string(index=False)) + "\n"
    return export.nodes_table(graph, include_bookkeeping=args.all)


def print_table(graph: Any, args: argparse.Namespace, width: int | None = None) -> None:
    """The node (or layer) table on stdout, at the terminal's width."""
    import sys

    from introspect.cli.tables import console_for, emit

    console = console_for(sys.stdout, width)
    emit(console, layer_table(graph, console.width) if args.layers
         else node_table(graph, console.width, include_bookkeeping=args.all))
    hidden = sum(r.kind == "shape" for r in graph.records) if not args.all else 0
    if hidden and not args.layers:
        console.print(f"{hidden} shape-bookkeeping nodes (ints, sizes) hidden; --all shows them",
                      soft_wrap=True)
    for note in graph.notes:
        console.print(f"note: {note}", soft_wrap=True)


def node_table(graph: Any, width: int, *, include_bookkeeping: bool = False) -> Any:
    """One row per node: where it is, what it does, its shape, params and FLOPs."""
    from introspect.cli.tables import Column, table

    records = [r for r in graph.records if include_bookkeeping or r.kind != "shape"]
    columns = [Column("#", 4, justify="right"), Column("node", 0, flex=5, cut="start"),
               Column("op", 0, flex=2, min_width=12), Column("layer", 0, flex=2, min_width=15),
               Column("shape", 0, flex=2, min_width=12), Column("params", 9, justify="right"),
               Column("FLOPs", 11, justify="right")]
    rows = [(str(r.index), r.name, r.op_type, r.layer, r.shapes or r.value,
             f"{r.params:,}" if r.params else "", f"{r.flops:,}" if r.flops else "")
            for r in records]
    return table(columns, rows, width=width, title=graph.title)


def layer_table(graph: Any, width: int) -> Any:
    """One row per layer: node counts, params, FLOPs and the output's shape."""
    from introspect.cli.tables import Column, table

    columns = [Column("layer", 0, flex=2, min_width=10), Column("nodes", 5, justify="right"),
               Column("tensors", 7, justify="right"), Column("params", 11, justify="right"),
               Column("FLOPs", 15, justify="right"), Column("output shape", 0, flex=3)]
    rows = [(r.layer, str(r.nodes), str(r.tensor_nodes), f"{r.params:,}", f"{r.flops:,}",
             r.output_shape) for r in graph.layers.itertuples()]
    return table(columns, rows, width=min(width, 120), title=graph.title)
