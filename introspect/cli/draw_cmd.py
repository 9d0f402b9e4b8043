"""Draw a BERT's tensor flow, from the tokens to the logits, as SVG, PNG, PDF or DOT.

Examples:
  introspect draw                                   # minilm.svg: every module open, layers folded
  introspect draw --head sequence-classification -o reports/minilm.svg
  introspect draw --model bert-base --depth 1 -o bert.png      # the big blocks only
  introspect draw --model bert-base --expand 0,-1 -o bert.svg  # first and last layer open
  introspect draw --depth full --no-fold -o every-node.pdf     # every node of the graph
  introspect draw --text "I love cats!" --format dot -o -      # DOT on stdout

--depth: 0 draws the model as one box, 1 the big blocks (embeddings, attention mask,
encoder layers, pooler, head), 2 and 3 open them further; without --depth every module
is open; 'full' draws every node, layout ops and mask building included. Identical
encoder layers are drawn once, marked ×N (--no-fold draws each); --expand keeps chosen
layers open (negative counts from the end). The format follows the file name (.svg,
.png, .pdf, .dot) unless --format says otherwise. SVG, PNG and PDF need Graphviz's 'dot'.
"""

from __future__ import annotations

import argparse

from introspect.cli.options import (
    add_model_options,
    add_verbosity_options,
    check_texts,
    say,
    whole_number,
)

FORMATS = ("svg", "png", "pdf", "dot")


def depth_value(text: str) -> int | str:
    """--depth: a whole number >= 0, or 'full'."""
    if text == "full":
        return text
    try:
        value = whole_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"depth must be a number >= 0 or 'full', not {text!r}"
        ) from e
    if value < 0:
        raise argparse.ArgumentTypeError(f"depth must be >= 0, not {value}")
    return value


def layer_list(text: str) -> tuple[int, ...]:
    """--expand: comma-separated layer numbers, such as '0,-1'."""
    try:
        return tuple(whole_number(part.strip()) for part in text.split(",") if part.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"--expand takes layer numbers separated by commas, such as 0,-1; not {text!r}"
        ) from e


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument(
        "--depth",
        type=depth_value,
        default=None,
        metavar="N|full",
        help="module levels to open: 0, 1, 2, 3, ... or 'full' (default: every module)",
    )
    parser.add_argument(
        "--full",
        dest="depth",
        action="store_const",
        const="full",
        help="same as --depth full: every node",
    )
    parser.add_argument(
        "--fold",
        dest="fold",
        action="store_true",
        default=None,
        help="draw identical encoder layers once, marked ×N (default, except with --depth full)",
    )
    parser.add_argument(
        "--no-fold", dest="fold", action="store_false", help="draw every encoder layer"
    )
    parser.add_argument(
        "--expand",
        type=layer_list,
        default=(),
        metavar="LAYERS",
        help="layers to keep open when folding, e.g. 0,-1",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="file to write, .svg (default: MODEL.svg), .png, .pdf or .dot; '-' for stdout",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="svg, png, pdf or dot (default: from the file name)",
    )
    add_verbosity_options(parser)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from introspect.cli.outputs import check_outputs, is_stdout, write_output
    from introspect.render.output import format_for, require_dot

    check_texts(args.text)
    output = args.output or f"{Path(str(args.model)).name or 'model'}.svg"
    fmt = format_for(None if is_stdout(output) else output, args.format)
    require_dot(fmt)  # fail before the slow part, and before any file is touched
    check_outputs({"-o": output})
    if args.expand:  # layer numbers against the model's layers, before loading it
        from introspect.models.load import check_model_source
        from introspect.render.fold import resolve_expand

        resolve_expand(args.expand, check_model_source(args.model))
    write_output(output, render_drawing(args, fmt))
    if not is_stdout(output):
        say(args, f"wrote {output}")
    return 0


def render_drawing(args: argparse.Namespace, fmt: str) -> bytes:
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.graph import trace
    from introspect.render import draw_graph, render_bytes

    loaded, inputs = load_model_and_inputs(args)
    with step(args, "tracing and propagating shapes"):
        graph = trace(loaded.model, inputs, title=f"{args.model} {args.head} ({args.attn})")
    for note in graph.notes if args.verbose else ():  # layers traced in full, the mask
        say(args, note)
    with step(args, f"drawing ({fmt})"):
        digraph = draw_graph(
            graph,
            depth=args.depth,
            fold=args.fold,
            expand=args.expand,
            title=f"{type(loaded.model).__name__} · {args.model}",
        )
        return render_bytes(digraph, fmt)
