"""``introspect diff --nproc N``: a tensor-parallel port run on N ranks (torch.distributed).

The port is ``--candidate path/to/port.py:NAME``: NAME(reference) runs on every rank after
the process group is up (gloo on the CPU, NCCL on CUDA), may read get_rank() and
get_world_size(), and returns that rank's module, whose forward calls the collectives
itself. The ranks' values are joined into whole tensors by value and diffed against the
reference run in this process (see docs/parallel.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from introspect.cli.implementations import implementation
from introspect.errors import InputError

# Options that name something --nproc does not do, and why.
_NOT_WITH = {"candidate_dump": "--candidate-dump (a folder of rank dumps needs no --nproc)",
             "reference_dump": "--reference-dump", "generate": "--generate",
             "backward": "--backward", "noise_budget": "--noise-budget",
             "candidate_dtype": "--candidate-dtype (cast in your build)",
             "candidate_model": "--candidate-model", "candidate_attn": "--candidate-attn"}


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", metavar="N",
                        help="run the --candidate port on N processes under torch.distributed "
                             "(gloo on the CPU, NCCL on CUDA), as torchrun does: build(reference) "
                             "runs on every rank, the ranks' values are joined into whole "
                             "tensors by value (concatenated shards, summed partials)")
    parser.add_argument("--nproc-timeout", metavar="SECONDS", default="600",
                        help="with --nproc: stop the ranks, and fail with exit 2, when they "
                             "have not finished after this long; a collective waits as long "
                             "(default: 600)")


def uses_nproc(args: argparse.Namespace) -> bool:
    return getattr(args, "nproc", None) is not None


def check_parallel(args: argparse.Namespace) -> int:
    """The cheap checks of --nproc, before anything loads; the number of ranks."""
    from introspect.diff.parallel.run import check_nproc
    from introspect.models.ports import is_port_spec

    nproc = check_nproc(args.nproc)
    args.nproc_seconds = _seconds(args.nproc_timeout)
    for option, shown in _NOT_WITH.items():
        if getattr(args, option, None):
            raise InputError(f"--nproc does not mix with {shown}")
    if not is_port_spec(args.candidate):
        raise InputError(f"--nproc runs a port on every rank: give --candidate "
                         f"path/to/port.py:NAME (or package.module:NAME), not "
                         f"{args.candidate!r}")
    return nproc


def compute_parallel_diff(args: argparse.Namespace, atol: float | None,
                          rtol: float | None) -> Any:
    """Load the reference and the inputs, run the port on the ranks, diff the joined values."""
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.diff.parallel import diff_parallel
    from introspect.models.ports import LoadedReference

    nproc = check_parallel(args)
    implementation("--reference", args.reference)
    loaded, inputs = load_model_and_inputs(args)
    if args.reference != "hf":
        raise InputError("--nproc diffs against the hf reference (--reference hf)")
    reference = LoadedReference(loaded.model, loaded.model.config, loaded.folder,
                                loaded.tokenizer, loaded.source, loaded.head, loaded.attn)
    label = f"hf {type(loaded.model).__name__} ({args.model}, {args.attn})"
    with step(args, f"running {args.candidate} on {nproc} ranks"):
        return diff_parallel(reference, args.candidate, inputs, nproc, atol=atol, rtol=rtol,
                             reference_label=label, timeout=args.nproc_seconds,
                             candidate_label=f"{args.candidate} on {nproc} ranks",
                             allow_nonfinite=args.allow_nonfinite)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError as e:
        raise InputError(f"--nproc-timeout takes seconds, got {text!r}") from e
    if not seconds > 0 or seconds == float("inf"):
        raise InputError(f"--nproc-timeout takes a number of seconds > 0, got {text!r}")
    return seconds
