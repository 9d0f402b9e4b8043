"""Run the reference and write its inputs and activations to one .safetensors file.

Examples:
  introspect capture -o ref.safetensors                    # MiniLM on the tutorial's texts
  introspect capture --model bert-large --select layers -o ref.safetensors
  introspect capture --layers 0,5 --noise -o ref.safetensors

The file holds the token ids under input.<name> and the value of every node that
computes (layout-only nodes and identities left out), named after the reference's fx
nodes; its metadata says what each tensor is (module path, layer, op, shape, dtype), the
texts, the tokens and the versions. FILE.index.json and FILE.index.csv describe each
tensor; the three are replaced as one set (all or none, whatever interrupts the write),
and a second capture to the same file waits for the first. A port in any framework feeds
the ids and dumps its own activations; then
'introspect diff --reference-dump FILE --candidate-dump PORT' finds where it parts.

--select layers keeps each layer's output only; --layers keeps chosen layers (indices or
embeddings, pooler, the head); --noise also stores each node's float32 rounding noise
(a float64 run), so that --noise-budget works against the file alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from introspect.cli.options import add_model_options, add_verbosity_options, say

SELECTIONS = ("all", "layers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("-o", "--output", metavar="FILE", required=True,
                        help="the .safetensors file to write")
    parser.add_argument("--select", default="all", choices=SELECTIONS,
                        help="all computing nodes (default) or each layer's output only")
    parser.add_argument("--layers", metavar="L",
                        help="only these layers: indices and names, comma-separated (0,3,pooler)")
    parser.add_argument("--noise", action="store_true",
                        help="also store each node's float32 noise (one float64 run)")
    parser.add_argument("--backward", action="store_true",
                        help="also write FILE.grads.safetensors: the reference's gradients on "
                             "the diff's default loss (node.<name>, param.<weight>, loss)")
    add_verbosity_options(parser)


def run(args: argparse.Namespace) -> int:
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.dump.capture import capture
    from introspect.dump.formats import capture_bytes, index_csv, index_json
    from introspect.errors import InputError
    from introspect.files import check_writable, printable_name, write_set

    target = Path(args.output)
    if target.suffix != ".safetensors":
        raise InputError(f"capture writes .safetensors; got {args.output!r}")
    index_paths = [target.with_suffix(".index.json"), target.with_suffix(".index.csv")]
    if args.backward:
        from introspect.dump.gradients import grads_path

        index_paths.append(grads_path(target))
    for path in (target, *index_paths):
        check_writable(path)  # fail before the slow part
    layers = [w for w in args.layers.split(",") if w.strip()] if args.layers else None
    if layers == []:
        raise InputError("--layers names no layer; give indices or names like 0,3,pooler")
    loaded, inputs = load_model_and_inputs(args)
    with step(args, "running the reference and capturing its activations"):
        captured = capture(loaded.model, inputs, select=args.select, layers=layers,
                           label=f"{args.model} {args.head} ({args.attn})", noise=args.noise)
    payload = capture_bytes(captured)
    # The gradients before any write: a failing backward leaves no file behind. They record
    # the capture's digest: a gradient file is read only with the capture it was made with.
    gradients = _gradients(args, loaded.model, inputs, captured, payload) if args.backward \
        else None
    # one set: the files are replaced together or not at all, the indexes last
    files: list[tuple[Path, str | bytes]] = [
        (target, payload), (index_paths[0], index_json(captured)),
        (index_paths[1], index_csv(captured))]
    stale = []
    if gradients is not None:
        files.insert(1, (index_paths[2], gradients))
    else:  # a gradient file of an earlier capture --backward belongs to no capture now
        from introspect.dump.gradients import grads_path

        stale.append(grads_path(target))
    write_set(files, remove=stale)
    if gradients is not None:
        say(args, f"wrote the reference's gradients to {printable_name(str(index_paths[2]))}")
    say(args, f"wrote {len(captured.entries)} tensors and the inputs to "
              f"{printable_name(str(target))} ({_size(len(payload))}), described in "
              f"{printable_name(index_paths[0].name)} and {printable_name(index_paths[1].name)}")
    return 0


def _gradients(args: argparse.Namespace, model: Any, inputs: Any, captured: Any,
               payload: bytes) -> bytes:
    """The reference's gradients, as the file next to the capture holds them
    (``introspect.dump.gradients``)."""
    from introspect.cli.progress import step
    from introspect.dump.formats import safetensors_bytes
    from introspect.dump.gradients import CAPTURE_DIGEST, capture_digest, capture_gradients

    with step(args, "running the reference backward"):
        tensors, metadata = capture_gradients(model, inputs,
                                              nodes={e.name for e in captured.entries})
    return safetensors_bytes(tensors, {**metadata, CAPTURE_DIGEST: capture_digest(payload)})


def _size(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    return ""
