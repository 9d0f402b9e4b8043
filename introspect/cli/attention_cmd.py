"""Draw what BERT's attention heads look at: head, matrix and model views, and statistics.

Examples:
  introspect attention                                   # attention.svg: layer 0, head 0
  introspect attention --text "time flies like an arrow" --layer 0 --heads 8 -o head.png
  introspect attention --view matrix --layer 2 --heads 0,3,8 -o matrix.svg
  introspect attention --view model --model bert-large -o model.svg   # 24 x 16 heads
  introspect attention -o attention.html                 # pick layer and head in a browser
  introspect attention --format json -o -                # per-head statistics and the maps
  introspect attention --format csv                      # the statistics of every head
  introspect attention --format csv --layer 0 --heads 8  # ... of the heads chosen

The probabilities are read from the model's own traced graph (softmax(q·kᵀ·scale + mask)
at each attention), so they are there under sdpa too and equal HF's output_attentions
under eager. Padding is never drawn. --layer and --heads take one index, a list such as
0,3,8 (negative counts from the end), or 'all'; --head is the model's head, as in every
command. Without --text the input is the sentence pair "time flies like an arrow" /
"fruit flies like a banana" (one input: [CLS] A [SEP] B [SEP]); --pair reads the texts
two by two the same way, otherwise each --text is one batch row (pick one with --row).

Views: head (bertviz's head view, drawn static: tokens on both sides, lines as opaque as
their weight), matrix (heatmap with token labels), model (layers x heads of small
heatmaps). Long inputs: the head view shows 64 tokens and the matrix 128 (--tokens
START:END picks which), with a notice; the model view averages blocks of tokens.
The format follows the file name (.svg, .png, .html, .json, .csv) unless --format says
otherwise; '-o -' writes SVG (or JSON, CSV) to stdout. PNG needs cairosvg.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from introspect.cli.options import add_model_options, add_verbosity_options, say, whole_number

VIEWS = ("head", "matrix", "model")
FORMATS = ("svg", "png", "html", "json", "csv")
DEFAULT_PAIR = ("time flies like an arrow", "fruit flies like a banana")
_EXTENSIONS = {".svg": "svg", ".png": "png", ".html": "html", ".htm": "html",
               ".json": "json", ".csv": "csv"}


def index_list(text: str) -> tuple[int, ...]:
    """--layer/--heads: one index, indices separated by commas, or 'all' (``()``)."""
    if text.strip() == "all":
        return ()
    try:
        values = tuple(whole_number(part.strip()) for part in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"expected an index, a list such as 0,3,8, or 'all'; not {text!r}") from e
    return values


def token_window(text: str) -> tuple[int, int]:
    """--tokens START:END, as Python slices (END excluded)."""
    start, _, end = text.partition(":")
    try:
        window = whole_number(start or "0"), whole_number(end) if end else 1 << 30
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--tokens takes START:END, such as 0:64; not {text!r}") \
            from e
    if window[0] < 0 or window[1] <= window[0]:
        raise argparse.ArgumentTypeError(f"--tokens {text!r} is empty or negative")
    return window


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    for action in parser._actions:  # the default text differs from the other commands'
        if action.dest == "text":
            action.help = ("input text, repeatable (default: the pair 'time flies like an "
                           "arrow' / 'fruit flies like a banana')")
    parser.add_argument("--pair", action="store_true",
                        help="read the texts two by two as sentence pairs (A [SEP] B)")
    parser.add_argument("--layer", type=index_list, default=None, metavar="L",
                        help="layer(s): 0, 0,3,8 or all (default: 0; model view: all)")
    parser.add_argument("--heads", type=index_list, default=None, metavar="N",
                        help="attention head(s): 8, 0,3,8 or all (default: 0; model view: all)")
    parser.add_argument("--row", type=whole_number, default=0, metavar="B",
                        help="the batch row (text) to draw (default: 0)")
    parser.add_argument("--tokens", type=token_window, metavar="START:END",
                        help="the window of tokens the head and matrix views show")
    parser.add_argument("--view", choices=VIEWS, default="head",
                        help="head (default), matrix or model")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="file to write: .svg (default: attention.svg), .png, .html, "
                             ".json, .csv; '-' for stdout")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="svg, png, html, json or csv (default: from the file name)")
    add_verbosity_options(parser)


def output_format(output: str | None, fmt: str | None) -> str:
    """The format: --format, else the file's extension, else svg."""
    from pathlib import Path

    from introspect.errors import InputError

    if fmt is not None:
        return fmt
    if output in (None, "-"):
        return "svg"
    suffix = Path(str(output)).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise InputError(f"cannot tell the format of {output!r}: use a name ending in "
                         f"{', '.join(_EXTENSIONS)} or pass --format")
    return _EXTENSIONS[suffix]


def run(args: argparse.Namespace) -> int:
    from introspect.files import check_writable, write_atomic

    fmt = output_format(args.output, args.format)
    to_stdout = args.output == "-" or (args.output is None and fmt in ("json", "csv"))
    output = None if to_stdout else (args.output or f"attention.{fmt}")
    texts = _texts(args)
    if fmt == "png":
        from introspect.attention.raster import check_png_converter

        check_png_converter()
    if to_stdout and fmt in ("png", "html"):
        from introspect.errors import InputError

        raise InputError(f"{fmt} does not go to stdout; give a file name with -o")
    if output:
        check_writable(output)
    chosen_layers, chosen_heads = _check_indices(args, texts)  # before loading: sizes known
    maps = compute_maps(args, texts)
    layers = _resolve(chosen_layers, maps.num_layers)
    heads = _resolve(chosen_heads, maps.num_heads)
    maps.check(layers=layers, heads=heads, batch=args.row)
    data = render(maps, args, fmt, layers, heads)
    if to_stdout:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        write_atomic(str(output), data)
        say(args, f"wrote {output}")
    return 0


def _texts(args: argparse.Namespace) -> tuple[str, ...]:
    from introspect.errors import InputError

    texts = tuple(args.text) if args.text else DEFAULT_PAIR
    for i, text in enumerate(texts, 1):
        if not text.strip():
            raise InputError(f"text {i} is empty; give every --text some words")
    if _paired(args) and len(texts) % 2:
        raise InputError(f"--pair reads texts two by two; got {len(texts)} texts")
    return texts


def _paired(args: argparse.Namespace) -> bool:
    return bool(args.pair or not args.text) and args.head != "multiple-choice"


def model_sizes(model: str) -> tuple[int, int] | None:
    """(layers, heads) of a model name or folder from its config, without loading weights."""
    from pathlib import Path

    from introspect.errors import IntrospectError
    from introspect.models.load import DEFAULT_MODEL, RANDOM_SIZES, minilm_folder
    from introspect.models.validate import read_config

    if model in RANDOM_SIZES:
        _, layers, heads, _ = RANDOM_SIZES[model]
        return layers, heads
    try:
        folder = minilm_folder() if model == DEFAULT_MODEL else Path(model)
        config = read_config(folder)  # a regular file, size-capped
        return int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    except (IntrospectError, OSError, ValueError, KeyError, TypeError):
        return None  # loading will say what is wrong with the source


def _check_indices(args: argparse.Namespace,
                   texts: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """--layer/--heads as chosen (``()`` = all); out-of-range indices fail before loading."""
    from introspect.errors import InputError

    unset = () if args.view == "model" else (0,)  # the model view shows every head
    layers = args.layer if args.layer is not None else unset
    heads = args.heads if args.heads is not None else unset
    sizes = model_sizes(str(args.model))
    rows = len(texts) // 2 if _paired(args) else len(texts)
    if args.head == "multiple-choice":
        rows = len(texts)  # the choices of one example are the rows attention sees
    if not 0 <= args.row < rows:
        raise InputError(f"--row {args.row} is out of range: the input has {rows} row(s) "
                         f"(0 to {rows - 1})")
    if sizes is not None:
        for name, chosen, count in (("layer", layers, sizes[0]), ("head", heads, sizes[1])):
            for value in chosen:
                if not -count <= value < count:
                    raise InputError(f"{name} {value} is out of range: {args.model} has "
                                     f"{count} {name}s (0 to {count - 1})")
    return layers, heads


def _resolve(chosen: tuple[int, ...], count: int) -> list[int]:
    """Indices as given, negative ones counted from the end; ``()`` means all."""
    if not chosen:
        return list(range(count))
    return [value + count if value < 0 else value for value in chosen]


def compute_maps(args: argparse.Namespace, texts: tuple[str, ...]) -> Any:
    """Load the model, tokenize the texts (pairs where asked) and read the attention maps."""
    from introspect.attention import attention
    from introspect.cli.progress import step
    from introspect.models.load import load_model, tokenize

    with step(args, f"loading {args.model} ({args.head}, {args.attn})"):
        loaded = load_model(args.model, head=args.head, attn=args.attn)
    max_length = int(getattr(loaded.model.config, "max_position_embeddings", 512))
    inputs = tokenize(loaded.tokenizer, texts, head="next-sentence" if _paired(args)
                      else args.head, max_length=max_length)
    if _paired(args):
        inputs.texts = tuple(f"{a} / {b}" for a, b in zip(texts[0::2], texts[1::2],
                                                          strict=True))
    from introspect.cli.options import say_note

    for note in [*loaded.notes, *inputs.notes]:
        say_note(args, note)
    with step(args, "tracing and reading the attention probabilities"):
        return attention(loaded.model, inputs, title=f"{args.model}")


def render(maps: Any, args: argparse.Namespace, fmt: str, layers: list[int],
           heads: list[int]) -> bytes:
    """The chosen view in the chosen format, as bytes."""
    from introspect.cli.progress import step

    with step(args, f"drawing ({args.view}, {fmt})"):
        if fmt == "html":
            return maps.html(batch=args.row).encode("utf-8")
        if fmt == "json":
            return stats_json(maps, args, layers, heads).encode("utf-8")
        if fmt == "csv":  # every head, or those --layer and --heads pick
            stats = maps.stats()
            if args.layer is not None:
                stats = stats[stats["layer"].isin(layers)]
            if args.heads is not None:
                stats = stats[stats["head"].isin(heads)]
            return stats.to_csv(index=False, float_format="%.6f").encode("utf-8")
        svg = maps.svg(args.view, layers=layers, heads=heads, batch=args.row,
                       window=args.tokens)
        if fmt == "png":
            from introspect.attention.raster import svg_to_png

            return svg_to_png(svg)
        return svg.encode("utf-8")


def stats_json(maps: Any, args: argparse.Namespace, layers: list[int], heads: list[int]) -> str:
    """Per-head statistics of every head, and the weights of the chosen heads on one row."""
    import json

    chosen = [{"layer": layer, "head": head,
               "weights": [[round(float(w), 6) for w in row]
                           for row in maps.head(layer, head, args.row).tolist()]}
              for layer in layers for head in heads]
    document = {
        "model": str(args.model), "head": args.head, "attn": args.attn,
        "texts": list(maps.texts), "layers": maps.num_layers, "heads": maps.num_heads,
        "row": args.row, "tokens": list(maps.real_tokens(args.row)),
        "stats": maps.stats().to_dict(orient="records"),
        "maps": chosen,
    }
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------------------
# The hook of `introspect diff`: which attention head parts first (issue 14)


def head_parity_for_diff(reference: Any, candidate: Any, inputs: Any,
                         args: argparse.Namespace) -> Any:
    """Head-by-head parity of the two models of a diff; None when they hold no attention
    or cannot be compared head by head (the diff itself has said what matters)."""
    from introspect.attention import compare_heads
    from introspect.cli.progress import step
    from introspect.diff.tolerance import parse_tolerance
    from introspect.errors import IntrospectError

    atol = parse_tolerance("--atol", args.atol) if getattr(args, "atol", None) else None
    rtol = parse_tolerance("--rtol", args.rtol) if getattr(args, "rtol", None) else None
    try:
        with step(args, "comparing the attention heads"):
            return compare_heads(reference, candidate, inputs, atol=atol, rtol=rtol)
    except IntrospectError as e:
        if getattr(args, "verbose", False):
            say(args, f"attention heads not compared: {e}")
        return None


def print_head_parity(parity: Any, stream: Any, *, quiet: bool = False) -> None:
    """The first divergent head (or that all heads agree) on the human stream."""
    if parity is not None and (not quiet or not parity.all_passed):
        stream.write(parity.summary() + "\n")


def head_parity_files(parity: Any) -> dict[str, str | bytes]:
    """What --out holds of the heads: heads.csv, and heads.svg (the first divergent head,
    reference, candidate and difference side by side)."""
    if parity is None:
        return {}
    files: dict[str, str | bytes] = {"heads.csv": parity.csv()}
    if parity.first_divergence is not None:
        files["heads.svg"] = parity.svg(*parity.first_divergence)
    return files
