"""Compare two implementations of a BERT node by node and find where they part.

Examples:
  introspect diff                                   # HF MiniLM against the from-scratch BERT
  introspect diff --model bert-base --head masked-lm --attn eager
  introspect diff --candidate hf --candidate-dtype bfloat16 --noise-budget
  introspect diff --candidate hf --candidate-attn eager    # sdpa against eager, both HF
  introspect diff --candidate hf --candidate-model ./my-fine-tune
  introspect diff --out parity-report --junit junit.xml    # CI: reports, exit 1 on failure

The graphs are aligned on the weights each node reads, then both models run side by
side on the texts (default: the tutorial's padded pair). Each aligned node gets its
propagated error (each model on its own) and its local error (the candidate's node fed
the reference's values); the first node whose local error is over budget is where the
implementations part, with a hint when the cause is a known one.

Budgets: |cand - ref| <= atol + rtol * |ref|; defaults per dtype (float32: rtol 1.3e-6,
atol 1e-5; bfloat16: 1.6e-2, 1e-5; float16: 1e-3, 1e-5); --noise-budget runs the
reference in float64 and raises each node's atol to 4x its own noise.

--out DIR writes diff.json, nodes.csv, layers.csv, diff.md (for a pull request),
diff.html (self-contained), junit.xml (one test case per layer) and diff.svg (the
drawing, coloured by error). Exit status: 0 parity holds, 1 it fails, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from introspect.cli.dump_diff import add_dump_arguments, compute_dump_diff, uses_dumps
from introspect.cli.options import add_model_options, add_verbosity_options, say

IMPLEMENTATIONS = ("hf", "scratch")
DTYPES = ("float32", "float64", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--reference", default="hf", choices=IMPLEMENTATIONS,
                        help="the implementation trusted (default: hf)")
    parser.add_argument("--candidate", default="scratch", choices=IMPLEMENTATIONS,
                        help="the implementation checked (default: scratch)")
    parser.add_argument("--candidate-model", metavar="PATH",
                        help="load the candidate from this checkpoint folder instead "
                             "(a fine-tune, a conversion, a quantised copy)")
    parser.add_argument("--candidate-dtype", choices=DTYPES, metavar="D",
                        help=f"cast the candidate to this dtype: {', '.join(DTYPES)}")
    parser.add_argument("--candidate-attn", choices=("sdpa", "eager"), metavar="A",
                        help="the candidate's attention implementation (default: --attn)")
    parser.add_argument("--atol", metavar="X", help="absolute tolerance (default: per dtype)")
    parser.add_argument("--rtol", metavar="X", help="relative tolerance (default: per dtype)")
    parser.add_argument("--noise-budget", action="store_true",
                        help="run the reference in float64 too and set each node's budget "
                             "from its own numerical noise")
    parser.add_argument("--out", metavar="DIR", help="write every report into this folder")
    parser.add_argument("--json", metavar="FILE", help="write the JSON report here")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    parser.add_argument("--nodes", action="store_true",
                        help="print every aligned node, not only those over budget")
    add_dump_arguments(parser)
    add_verbosity_options(parser)


def run(args: argparse.Namespace) -> int:
    from introspect.diff.tolerance import parse_tolerance
    from introspect.files import check_writable, check_writable_folder, write_atomic

    atol = parse_tolerance("--atol", args.atol) if args.atol is not None else None
    rtol = parse_tolerance("--rtol", args.rtol) if args.rtol is not None else None
    if args.out:  # fail before the slow part
        check_writable_folder(args.out)
    for path in (args.json, args.junit):
        if path:
            check_writable(path)
    result = compute_dump_diff(args, atol, rtol) if uses_dumps(args) else \
        compute_diff(args, atol, rtol)
    reports = _render(result, args)
    if args.out:
        from introspect.report import write_reports

        write_reports(result, args.out, drawing=not uses_dumps(args))  # a drawing needs graphs
    for path, text in reports.items():
        write_atomic(path, text)
    if not args.quiet:
        sys.stdout.write(_terminal_text(result, args))
    return 0 if result.passed else 1


def compute_diff(args: argparse.Namespace, atol: float | None, rtol: float | None) -> Any:
    """Load both models and the inputs the options name, and diff them."""
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.diff.api import diff

    loaded, inputs = load_model_and_inputs(args)
    candidate_attn = args.candidate_attn or args.attn
    reference, reference_label = _implementation(args.reference, loaded, None, args.attn, args)
    candidate, candidate_label = _implementation(args.candidate, loaded, args.candidate_model,
                                                 candidate_attn, args)
    if args.candidate_dtype:
        import copy

        import torch

        if candidate is reference:  # HF against HF in another dtype: cast a copy
            candidate = copy.deepcopy(reference)
        candidate = candidate.to(getattr(torch, args.candidate_dtype))
        candidate_label = f"{candidate_label}, {args.candidate_dtype}"
    with step(args, f"diffing {candidate_label} against {reference_label}"):
        return diff(reference, candidate, inputs, atol=atol, rtol=rtol,
                    noise_budget=args.noise_budget, reference_label=reference_label,
                    candidate_label=candidate_label)


def _implementation(kind: str, loaded: Any, folder: str | None, attn: str,
                    args: argparse.Namespace) -> tuple[Any, str]:
    """The model of ``kind`` (hf or scratch) for the loaded source, or for ``folder``."""
    from introspect.cli.progress import step
    from introspect.load import HEADS, load_model

    source = folder or args.model
    label = f"{kind} {HEADS[args.head]} ({source}, {attn})"
    if kind == "hf":
        if folder is None and attn == loaded.attn:
            return loaded.model, label
        with step(args, f"loading {source} ({args.head}, {attn})"):
            other = load_model(source, head=args.head, attn=attn)
        for note in other.notes if folder else []:
            say(args, note)
        return other.model, label
    import warnings

    from introspect import scratch

    model_class = scratch.MODELS[HEADS[args.head]]
    checkpoint = folder or loaded.folder
    with step(args, f"building the from-scratch {HEADS[args.head]}"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", scratch.LoadingWarning)  # load_model said so already
        if checkpoint is not None:
            model = model_class.from_pretrained(checkpoint, attn_implementation=attn)
        else:
            model = model_class.from_hf(loaded.model, attn_implementation=attn)
    return model, label


def _render(result: Any, args: argparse.Namespace) -> dict[str, str]:
    from introspect.report import json_report, junit_xml

    reports = {}
    if args.json:
        reports[args.json] = json_report(result)
    if args.junit:
        reports[args.junit] = junit_xml(result)
    return reports


def _terminal_text(result: Any, args: argparse.Namespace) -> str:
    from introspect.diff.records import STATUS_DRIFT, STATUS_FAIL

    lines = [result.summary(), "", result.layer_table()]
    shown = [r for r in result.rows if r.status in (STATUS_FAIL,)
             or (args.nodes and r.local_max_abs_err is not None)
             or (args.nodes and r.status == STATUS_DRIFT)]
    if shown:
        lines += ["", f"{'reference node':<48} {'candidate node':<40} {'op':<20} "
                      f"{'local_max':>10} {'max_abs':>10}  status"]
        for r in shown[:200 if args.nodes else 20]:
            lines.append(f"{r.reference_node:<48} {r.candidate_node:<40} {r.op[:20]:<20} "
                         f"{r.local_max_abs_err or 0.0:>10.3g} {r.max_abs_err or 0.0:>10.3g}  "
                         f"{r.status}")
    if args.out:
        lines += ["", f"reports written to {args.out}"]
    return "\n".join(lines) + "\n"
