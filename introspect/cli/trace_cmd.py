"""Trace a BERT with torch.fx and list every node with its shapes.

Examples:
  introspect trace                                  # table of the embedded MiniLM
  introspect trace --head sequence-classification --format csv -o nodes.csv
  introspect trace --model bert-base --text "I love cats!" --format json -o graph.json
  introspect trace --format graphml -o graph.graphml   # for networkx, Gephi, yEd

--format table prints to the terminal (or writes the text to -o); csv, json and graphml
go to -o FILE, or to stdout without -o. --layers lists one row per layer instead of one
per node (table and csv). Texts longer than the model's maximum positions (512 tokens)
are truncated, with a notice.
"""

from __future__ import annotations

import argparse
import sys

from introspect.cli.options import add_model_options, add_verbosity_options, say

FORMATS = ("table", "csv", "json", "graphml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--format", default="table", choices=FORMATS,
                        help="table (default), csv, json or graphml")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--layers", action="store_true", help="one row per layer (table, csv)")
    parser.add_argument("--all", action="store_true",
                        help="table: also show shape-bookkeeping nodes (ints, sizes)")
    add_verbosity_options(parser)


def run(args: argparse.Namespace) -> int:
    from introspect.files import check_writable, write_atomic

    if args.output:
        check_writable(args.output)  # fail before the slow part
    text = render_trace(args)
    if args.output:
        write_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def render_trace(args: argparse.Namespace) -> str:
    from introspect import export
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.graph import trace

    loaded, inputs = load_model_and_inputs(args)
    with step(args, "tracing and propagating shapes"):
        graph = trace(loaded.model, inputs, title=f"{args.model} {args.head} ({args.attn})")
    for note in graph.notes if args.verbose else ():  # layers traced in full, the mask
        say(args, note)
    if args.format == "csv":
        return export.layers_csv(graph) if args.layers else export.nodes_csv(graph)
    if args.format == "json":
        return export.graph_json(graph, model=str(args.model), head=args.head, attn=args.attn)
    if args.format == "graphml":
        return export.graph_graphml(graph)
    if args.layers:
        return graph.layers.to_string(index=False) + "\n"
    return export.nodes_table(graph, include_bookkeeping=args.all)
