"""Trace a BERT with torch.fx and list every node with its shapes.

Examples:
  introspect trace                                  # table of the embedded MiniLM
  introspect trace --head sequence-classification --format csv -o nodes.csv
  introspect trace --model bert-base --text "I love cats!" --format json -o graph.json
  introspect trace --format graphml -o graph.graphml   # for networkx, Gephi, yEd

--format table prints a table that fits the terminal, one heading per layer, node names
without their layer's prefix and folded where long (numbers are never cut); identical
encoder layers are shown once, marked xN, as the drawing folds them (--no-fold lists every
layer). --depth N prints one row per module down to N levels instead, as torchinfo does.
Then the totals: parameters, trainable, parameter bytes, input and activation bytes, FLOPs
(2 x M x N x K of every linear, matmul, bmm, baddbmm, addmm and attention; other ops are
not counted), nodes. -o FILE writes the same text as a terminal as wide as COLUMNS
(default 120) would show; csv, json and graphml go to -o FILE, or to stdout without -o or
with -o -. --layers lists one row per layer instead of one per node (table and csv). Texts
longer than the model's maximum positions (512 tokens) are truncated, with a notice.
"""

from __future__ import annotations

import argparse
from typing import Any

from introspect.cli.options import (
    add_model_options,
    add_verbosity_options,
    check_texts,
    say,
    whole_number,
)

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
    parser.add_argument("--depth", type=_depth, metavar="N",
                        help="table: one row per module down to N levels (1: blocks, 2: "
                             "their modules, ...), as torchinfo")
    parser.add_argument("--no-fold", dest="fold", action="store_false",
                        help="table: list every encoder layer (default: identical ones once, "
                             "xN)")
    add_verbosity_options(parser)


def _depth(text: str) -> int:
    try:
        depth = whole_number(text)
    except ValueError:
        depth = -1
    if depth < 1:
        raise argparse.ArgumentTypeError(f"--depth takes a number of module levels >= 1, "
                                         f"got {text!r}")
    return depth


def run(args: argparse.Namespace) -> int:
    from introspect.cli.outputs import check_outputs, is_stdout, write_output

    check_texts(args.text)
    check_outputs({"-o": args.output})  # fail before the slow part
    graph = trace_graph(args)
    if args.format == "table" and (not args.output or is_stdout(args.output)):
        print_table(graph, args)
    else:
        write_output(args.output or "-", render_trace(graph, args))
        if args.output and not is_stdout(args.output):
            say(args, f"wrote {args.output}")
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
    import io

    stream = io.StringIO()  # what the terminal shows, as wide as COLUMNS (default 120)
    print_table(graph, args, stream=stream)
    return stream.getvalue()


def print_table(graph: Any, args: argparse.Namespace, width: int | None = None,
                stream: Any = None) -> None:
    """The node (or layer) table and the totals on ``stream`` (stdout), at its width."""
    import sys

    from rich.text import Text

    from introspect.cli.tables import console_for, emit, prose
    from introspect.summary import FOLD_NOTE, module_table, totals_table

    console = console_for(stream or sys.stdout, width)
    fold = getattr(args, "fold", True)
    depth = getattr(args, "depth", None)
    folded = False
    if depth is not None:
        grid, folded = module_table(graph, console.width, depth, fold=fold)
        emit(console, grid)
    elif args.layers:
        emit(console, layer_table(graph, console.width))
    else:
        grid, folded = node_table(graph, console.width, include_bookkeeping=args.all, fold=fold)
        emit(console, grid)
    if folded:
        emit(console, Text(FOLD_NOTE + ("" if depth is not None else "; --no-fold lists them")))
    hidden = sum(r.kind == "shape" for r in graph.records) if not args.all else 0
    if hidden and not args.layers and depth is None:
        emit(console, Text(f"{hidden} shape-bookkeeping nodes (ints, sizes) hidden; "
                           "--all shows them"))
    console.print()
    emit(console, totals_table(graph))
    prose(console, FLOPS_CONVENTION, indent=0)
    for note in graph.notes:
        prose(console, f"note: {note}")


FLOPS_CONVENTION = ("FLOPs: 2 x M x N x K (a multiply and an add) for every linear, matmul, "
                    "bmm, baddbmm, addmm and attention; other ops are not counted. "
                    "Activations: every node's tensor output for this input, views included.")


def totals(graph: Any) -> list[tuple[str, int, str]]:
    """torchinfo's closing lines (``introspect.summary.totals``)."""
    from introspect.summary import totals as graph_totals

    return graph_totals(graph)


def node_label(name: str, layer: str) -> str:
    """A node's name without its layer's prefix (``bert_encoder_layer_3_attention_self_query``
    in ``encoder.layer.3``: ``attention_self_query``); the layer heads its rows."""
    prefix = layer.replace(".", "_") + "_"
    at = name.find(prefix)
    if layer and at >= 0 and (at == 0 or name[at - 1] == "_") and len(name) > at + len(prefix):
        return name[at + len(prefix):]
    return name


def node_table(graph: Any, width: int, *, include_bookkeeping: bool = False,
               fold: bool = True) -> tuple[Any, bool]:
    """One row per node under a heading per layer: what it does, its shape, params and
    FLOPs. Numbers take the width they need; names and shapes fold onto more lines.
    Identical consecutive encoder layers are shown once, under ``encoder.layer.0–11 ×12``.

    Returns the table and whether a layer was folded.
    """
    from introspect.cli.tables import Column, Heading, table
    from introspect.render.fold import layer_groups, layer_index, layer_members

    records = [r for r in graph.records if include_bookkeeping or r.kind != "shape"]
    groups = layer_groups(layer_members(records), fold=fold)
    group_of = {i: g for g in groups for i in range(g.first, g.last + 1)}
    shapes = [r.shapes or r.value for r in records]
    single = max((len(t) for t in shapes if "=" not in t), default=0)  # one tensor each
    columns = [Column("#", justify="right"), Column("node", 0, flex=4, min_width=12, cut="fold"),
               Column("op", 0, flex=2, min_width=10, cut="fold"),
               Column("shape", 0, flex=2, min_width=min(max(single, 12), 24), cut="fold"),
               Column("params", justify="right"), Column("FLOPs", justify="right")]
    rows: list[Any] = []
    layer = None
    folded = False
    for r in records:
        index = layer_index(r.layer)
        group = group_of.get(index) if index is not None else None
        if group is not None and group.count > 1 and index != group.first:
            continue  # shown once, as the first layer of its fold
        if r.layer != layer:
            layer = r.layer
            title = layer or "(no layer)"
            if group is not None and group.count > 1:
                title, folded = f"{group.label} (each layer)", True
            rows.append(Heading(title, 1, len(columns)))
        rows.append((str(r.index), node_label(r.name, r.layer), r.op_type, r.shapes or r.value,
                     f"{r.params:,}" if r.params else "", f"{r.flops:,}" if r.flops else ""))
    return table(columns, rows, width=width, title=graph.title), folded


def layer_table(graph: Any, width: int) -> Any:
    """One row per layer: node counts, params, FLOPs and the output's shape."""
    from introspect.cli.tables import Column, table

    columns = [Column("layer", 0, flex=2, min_width=10, cut="fold"),
               Column("nodes", justify="right"), Column("tensors", justify="right"),
               Column("params", justify="right"), Column("FLOPs", justify="right"),
               Column("output shape", 0, flex=3, cut="fold")]
    rows = [(r.layer, str(r.nodes), str(r.tensor_nodes), f"{r.params:,}", f"{r.flops:,}",
             r.output_shape) for r in graph.layers.itertuples()]
    return table(columns, rows, width=min(width, 120), title=graph.title)
