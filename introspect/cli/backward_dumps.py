"""``introspect diff --candidate-dump PORT --backward``: the port's gradient file against
the reference's (``introspect.dump.gradients``)."""

from __future__ import annotations

import argparse
from typing import Any

from introspect.errors import InputError


def check_backward_dumps(args: argparse.Namespace) -> None:
    """Before anything slow: --backward with dumps needs the port's gradient file."""
    from introspect.dump.gradients import grads_path

    if not args.candidate_dump:
        raise InputError("--backward with --reference-dump needs --candidate-dump: the port's "
                         "gradients are read from FILE.grads.safetensors (or .npz) next to it")
    for option, dump in (("--candidate-dump", args.candidate_dump),
                         ("--reference-dump", args.reference_dump)):
        if dump and not grads_path(dump).is_file():
            hint = "introspect capture --backward writes it" if option == "--reference-dump" \
                else "write node.<reference node> and param.<reference weight> gradients there"
            raise InputError(f"{option} {dump}: no gradient file {grads_path(dump)} ({hint})")


def add_dump_gradients(args: argparse.Namespace, result: Any) -> None:
    """Compare the gradient files and put the comparison on ``result`` (its verdict too)."""
    from introspect.cli.options import load_model_and_inputs
    from introspect.dump.gradients import (
        capture_gradients,
        compare_gradients,
        grads_path,
        read_gradients,
    )

    candidate = read_gradients(grads_path(args.candidate_dump))
    if args.reference_dump:
        from introspect.dump.gradients import check_belongs

        check_belongs(grads_path(args.reference_dump), args.reference_dump)
        reference = read_gradients(grads_path(args.reference_dump))
    else:
        loaded, inputs = load_model_and_inputs(args)
        reference, _ = capture_gradients(loaded.model, inputs, loss=getattr(args, "loss_fn", None))
    result.backward = compare_gradients(reference, candidate, result.tolerance,
                                        getattr(args, "allow_nonfinite", False))
    result.passed = result.passed and result.backward.passed
    if result.first_divergence is None and result.backward.first_divergence is not None:
        from introspect.diff.result import backward_divergence

        result.first_divergence = backward_divergence(result.backward.first_divergence)
