"""``introspect diff`` with activations on disk: --candidate-dump and --reference-dump.

Either side may be a file instead of a model: the candidate a port's dump (any framework,
its own names), the reference a capture written by ``introspect capture``. What is not a
file is a model loaded as usual, run on the capture's inputs when there is one.
"""

from __future__ import annotations

import argparse
from typing import Any

from introspect.cli.implementations import build_model, implementation
from introspect.cli.options import say


def add_dump_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--candidate-dump", metavar="FILE",
                        help="a port's activations (.safetensors, .npz, or a folder of .npy) "
                             "under its own names, aligned to the reference by value")
    parser.add_argument("--reference-dump", metavar="FILE",
                        help="a capture (introspect capture) that stands in for the reference")
    parser.add_argument("--dump-order", metavar="FILE",
                        help="the dump's tensor names in the order the port computed them")
    parser.add_argument("--name-map", metavar="FILE",
                        help="JSON: dump tensor name -> reference node name (optional help)")


def uses_dumps(args: argparse.Namespace) -> bool:
    return bool(args.candidate_dump or args.reference_dump)


def compute_dump_diff(args: argparse.Namespace, atol: float | None, rtol: float | None) -> Any:
    """Diff the sides the options name when at least one of them is a file."""
    from introspect.cli.progress import step
    from introspect.diff.parallel.rank_dumps import diff_rank_dumps, rank_entries
    from introspect.dump import capture, diff_dump, read_capture, read_dump
    from introspect.dump.formats import Dump
    from introspect.errors import InputError

    name_map = _name_map(args.name_map) if args.name_map else None
    ranks = bool(args.candidate_dump) and bool(rank_entries(args.candidate_dump))
    candidate_dump = read_dump(args.candidate_dump, args.dump_order) \
        if args.candidate_dump and not ranks else None
    reference_model = None
    if args.reference_dump:
        if args.text or getattr(args, "text_pair", None):
            option = "--text" if args.text else "--text-pair"
            raise InputError(f"{option} goes with a live reference; a capture holds its own "
                             "inputs (capture again with other texts)")
        reference = read_capture(args.reference_dump)
        reference_label = f"capture {args.reference_dump} ({reference.model})"
    else:
        reference_model, reference_label, inputs = _live_reference(args)
        with step(args, "running the reference and capturing its activations"):
            reference = capture(reference_model, inputs, noise=args.noise_budget,
                                label=reference_label)
    if ranks:  # a folder per rank: joined into whole tensors (introspect.diff.parallel)
        with step(args, f"joining the rank dumps in {args.candidate_dump}"):
            return diff_rank_dumps(reference, args.candidate_dump, order_file=args.dump_order,
                                   atol=atol, rtol=rtol, reference_model=reference_model,
                                   reference_label=reference_label, name_map=name_map,
                                   allow_nonfinite=getattr(args, "allow_nonfinite", False))
    if candidate_dump is None:
        from introspect.models.ports import is_port_spec, port_code

        candidate_model, candidate_label = _live_candidate(args)
        ports = [args.candidate] if is_port_spec(args.candidate) else []
        with step(args, f"running {candidate_label} on the capture's inputs"), \
                port_code(ports, "in its forward, while the capture ran it"):
            taken = capture(candidate_model, reference.inputs, label=candidate_label)
        candidate_dump = Dump(candidate_label, taken.values,
                              {k: str(v.dtype).split(".")[-1] for k, v in taken.values.items()},
                              True, dict(taken.inputs))
    else:
        candidate_label = f"dump {args.candidate_dump}"
    with step(args, f"aligning {candidate_label} to {reference_label}"):
        return diff_dump(reference, candidate_dump, atol=atol, rtol=rtol,
                         noise_budget=args.noise_budget, name_map=name_map,
                         reference_label=reference_label, candidate_label=candidate_label,
                         reference_model=reference_model,
                         allow_nonfinite=getattr(args, "allow_nonfinite", False))


def _live_reference(args: argparse.Namespace) -> tuple[Any, str, Any]:
    from introspect.cli.options import load_model_and_inputs

    loaded, inputs = load_model_and_inputs(args)
    model, label = build_model(implementation("--reference", args.reference), loaded, None,
                               args.attn, args)
    return model, label, inputs


def _live_candidate(args: argparse.Namespace) -> tuple[Any, str]:
    from introspect.cli.progress import step
    from introspect.models.load import load_model

    with step(args, f"loading {args.model} ({args.head}, {args.attn})"):
        loaded = load_model(args.model, head=args.head, attn=args.attn)
    for note in loaded.notes:
        say(args, note)
    return build_model(implementation("--candidate", args.candidate), loaded,
                       args.candidate_model, args.candidate_attn or args.attn, args)


def _name_map(path: str) -> dict[str, str]:
    from introspect.errors import InputError
    from introspect.files import printable_name, read_json

    # a regular file, size-capped, depth-limited; errors never quote its content
    mapping = read_json(path, "name map")
    if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise InputError(f"the name map {printable_name(path)!r} must be a JSON object of "
                         "names to node names")
    return {printable_name(k): printable_name(v) for k, v in mapping.items()}
