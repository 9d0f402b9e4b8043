"""Compare two implementations of a BERT node by node and find where they part.

Examples:
  introspect diff                                   # HF MiniLM against the from-scratch BERT
  introspect diff --model bert-base --head masked-lm --attn eager
  introspect diff --candidate hf --candidate-dtype bfloat16 --noise-budget
  introspect diff --candidate hf --candidate-attn eager    # sdpa against eager, both HF
  introspect diff --candidate ./my-fine-tune               # another checkpoint folder (HF)
  introspect diff --model bert-tiny --candidate my_port.py:build   # your port (see below)
  introspect diff --out parity-report --junit junit.xml    # CI: reports, exit 1 on failure
  introspect diff --json - --quiet | jq .first_divergence  # the JSON report on stdout
  introspect diff --model gpt2 --head causal-lm --candidate my_gpt.py:build --generate 16
  introspect diff --head masked-lm --backward             # gradients too, node by node

--reference and --candidate take hf, scratch (the from-scratch BERT), a checkpoint
folder, or your own port as path/to/port.py:NAME or package.module:NAME: NAME is a
callable that receives the loaded reference (.model, .config, .folder, .tokenizer) and
returns the torch.nn.Module to check, holding the reference's weights.

The graphs are aligned on the weights each node reads, then both models run side by
side on the texts. Each aligned node gets its propagated error (each model on its own)
and its local error (the candidate's node fed the reference's values); the first node
whose local error is over budget is where the implementations part, with a hint when the
cause is a known one.

Inputs: by default two sentence pairs of different lengths, so that the batch is padded
(the attention mask is exercised) and token_type_ids holds both segments; --text-pair A B
(repeatable) gives your own pairs, --text single sentences, one row each (the two do not
mix). The verdict notes what the inputs left untested (one segment only, no padding).

A port is untrusted code: the reference is fingerprinted around its build and its
forward, and a port that changes it, exits or raises what is not an Exception ends the
run with one line and exit 2, never a verdict.

--generate N decodes N tokens greedily from the first text on both sides, each with its
own key/value cache, and compares the prefill and every one-token step node by node and
every layer's cached keys and values by value (whatever their layout); both sides are fed
the reference's tokens (teacher forcing). A port is called as model(input_ids,
past_key_values=cache, use_cache=True) and returns (logits, cache); None starts a sequence.

Budgets: |cand - ref| <= atol + rtol * |ref|; defaults per dtype (float32: rtol 1.3e-6,
atol 1e-5; bfloat16: 1.6e-2, 1e-5; float16: 1e-3, 1e-5); --noise-budget runs the
reference in float64 and raises each node's atol to 4x its own noise.

Devices: --device D runs both models on D (cpu, cuda, cuda:1); --candidate-device D the
candidate alone, e.g. --candidate-dtype bfloat16 --candidate-device cuda --noise-budget
against the float32 reference on the CPU. Values are compared on the reference's device,
moved there one pair at a time. On CUDA, a float32 matmul under TF32 gets TF32's budget
(rtol 2e-3, atol 5e-3); the notes say which budget applied. See docs/devices.md.

--backward also runs both models backward on one loss (the head's own with seeded
labels, or --loss FILE.py:NAME, a loss(outputs, inputs) -> scalar for both sides) and
compares every aligned node's gradient, each node's own backward (the first over budget,
from the outputs, is where the backwards part), every weight's gradient and one SGD step.

--repro DIR, on failure, writes DIR/repro.py and DIR/inputs.safetensors: the reference's
and the candidate's ops at the first divergence as plain torch calls on the values
recorded there; `python DIR/repro.py` (torch and safetensors only) prints both errors and
exits 1 when they part. A passing diff writes nothing.

--out DIR writes diff.json, nodes.csv, layers.csv, diff.md (for a pull request),
diff.html (self-contained), junit.xml (one test case per layer) and diff.svg (the
drawing, coloured by error). --json and --junit take '-' for stdout; the verdict then
goes to stderr. --quiet prints only the verdict and, on failure, the first divergence
and its hints. Exit status: 0 parity holds, 1 it fails, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, cast

from introspect.cli.dump_diff import add_dump_arguments, compute_dump_diff, uses_dumps
from introspect.cli.implementations import (
    IMPLEMENTATION_HELP,
    Implementation,
    build_model,
    implementation,
)
from introspect.cli.options import (
    add_backward_options,
    add_device_options,
    add_model_options,
    add_text_pair_option,
    add_verbosity_options,
    backward_loss,
    check_devices,
    input_texts,
)
from introspect.cli.parallel_diff import (
    add_parallel_arguments,
    check_parallel,
    compute_parallel_diff,
    uses_nproc,
)
from introspect.cli.repro_option import (
    add_repro_argument,
    check_repro,
    tell_repro,
    write_repro_folder,
)
from introspect.errors import InputError

DTYPES = ("float32", "float64", "bfloat16", "float16")
# The file each single-file option's report has inside --out: the same report may go to
# both places, another report may not share its path.
FOLDER_FILES = {"--json": "diff.json", "--junit": "junit.xml"}

if TYPE_CHECKING:
    import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    add_text_pair_option(parser)
    parser.add_argument("--reference", default="hf", metavar="IMPL",
                        help=f"the implementation trusted: {IMPLEMENTATION_HELP} (default: hf)")
    parser.add_argument("--candidate", default="scratch", metavar="IMPL",
                        help=f"the implementation checked: {IMPLEMENTATION_HELP} "
                             "(default: scratch)")
    parser.add_argument("--candidate-model", metavar="PATH",
                        help="load the hf or scratch candidate from this checkpoint folder "
                             "(a fine-tune, a conversion, a quantised copy)")
    parser.add_argument("--candidate-dtype", choices=DTYPES, metavar="D",
                        help=f"cast the candidate to this dtype: {', '.join(DTYPES)}")
    parser.add_argument("--candidate-attn", choices=("sdpa", "eager"), metavar="A",
                        help="the hf or scratch candidate's attention implementation "
                             "(default: --attn)")
    add_device_options(parser)
    parser.add_argument("--atol", metavar="X",
                        help="absolute tolerance of the outputs (default: per dtype); nodes "
                             "inside the models keep their own")
    parser.add_argument("--rtol", metavar="X",
                        help="relative tolerance of the outputs (default: per dtype)")
    parser.add_argument("--noise-budget", action="store_true",
                        help="run the reference in float64 too and set each node's budget "
                             "from its own numerical noise (with --generate: the reference "
                             "in the candidate's dtype decodes beside it)")
    parser.add_argument("--allow-nonfinite", action="store_true",
                        help="report NaN or Inf in compared values as a note instead of "
                             "failing")
    parser.add_argument("--out", metavar="DIR", help="write every report into this folder")
    parser.add_argument("--json", metavar="FILE", help="write the JSON report here ('-': stdout)")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML here ('-': stdout)")
    parser.add_argument("--nodes", action="store_true",
                        help="print every compared node, not only those over budget")
    parser.add_argument("--generate", metavar="N",
                        help="decode N tokens greedily from the first text, each model with its "
                             "own key/value cache, and compare the prefill and every one-token "
                             "step node by node, and every layer's cache (a decoder with a "
                             "causal-lm head; a port is called as model(input_ids, "
                             "past_key_values=cache, use_cache=True) -> (logits, cache))")
    add_dump_arguments(parser)
    add_parallel_arguments(parser)
    add_backward_options(parser)
    add_repro_argument(parser)
    add_verbosity_options(parser, quiet_help="print only the verdict and, on failure, the "
                                             "first divergence and its hints")


def run(args: argparse.Namespace) -> int:
    from introspect.cli.diff_view import print_diff
    from introspect.cli.outputs import check_outputs, human_stream, write_output
    from introspect.diff.tolerance import parse_tolerance

    # Every cheap check first: nothing slow runs, and no file is touched, on bad input.
    atol = parse_tolerance("--atol", args.atol) if args.atol is not None else None
    rtol = parse_tolerance("--rtol", args.rtol) if args.rtol is not None else None
    input_texts(args)  # an empty text, or --text with --text-pair
    check_devices(args)  # a device this machine lacks: before anything loads
    args.generate = _generate_steps(args)
    args.loss_fn = backward_loss(args)  # --loss without --backward, or naming nothing
    if args.backward and uses_dumps(args):
        from introspect.cli.backward_dumps import check_backward_dumps

        check_backward_dumps(args)
    if args.out == "-":
        raise InputError("--out takes a folder; for a report on stdout use --json - or --junit -")
    check_repro(args)  # the modes it cannot serve, a folder that cannot be written
    if uses_nproc(args):
        check_parallel(args)  # a port on every rank: the port's file is imported there only
    reference_spec = implementation("--reference", args.reference)
    candidate_spec = Implementation("--candidate", args.candidate, "port") if uses_nproc(args) \
        else implementation("--candidate", args.candidate)
    _check_candidate_options(args, candidate_spec)
    _check_scratch_source(args, reference_spec, candidate_spec)
    from introspect.report import REPORT_FILES

    check_outputs({"--json": args.json, "--junit": args.junit}, folder=args.out,
                  folder_files=FOLDER_FILES, folder_names=REPORT_FILES)
    if args.candidate_model:  # a broken checkpoint is found before the reference loads
        from introspect.models.load import check_model_source

        check_model_source(args.candidate_model, copied=candidate_spec.kind == "scratch")
    result = compute_parallel_diff(args, atol, rtol) if uses_nproc(args) else \
        compute_dump_diff(args, atol, rtol) if uses_dumps(args) else \
        compute_diff(args, atol, rtol, reference_spec, candidate_spec)
    if args.backward and uses_dumps(args):
        from introspect.cli.backward_dumps import add_dump_gradients

        add_dump_gradients(args, result)
    if args.out:
        from introspect.cli.attention_cmd import head_parity_files
        from introspect.report import write_reports

        write_reports(result, args.out, drawing=result.reference is not None,  # no graph in a file
                      extra=head_parity_files(getattr(args, "head_parity", None)))
    repro_said = write_repro_folder(result, args)
    for path, text in _render(result, args).items():
        write_output(path, text)
    stream = human_stream(args.json, args.junit)
    print_diff(result, stream, quiet=args.quiet, all_nodes=args.nodes, out=args.out,
               heads=getattr(args, "head_parity", None))
    tell_repro(repro_said, stream, quiet=args.quiet)
    return 0 if result.passed else 1


def _generate_steps(args: argparse.Namespace) -> int:
    """--generate N: a positive number of tokens, and the options it does not mix with."""
    text = getattr(args, "generate", None)
    if text is None:
        return 0
    try:
        steps = int(text)
    except ValueError as e:
        raise InputError(f"--generate takes a number of tokens, got {text!r}") from e
    if steps < 1:
        raise InputError(f"--generate takes a number of tokens >= 1, got {steps}")
    if uses_dumps(args):
        raise InputError("--generate runs both models; it does not take activation dumps")
    if getattr(args, "backward", False):
        raise InputError("--generate does not mix with --backward (gradients are compared on "
                         "one forward; diff with --backward without --generate)")
    return steps


def _check_candidate_options(args: argparse.Namespace, candidate: Implementation) -> None:
    if candidate.kind in ("port", "folder"):
        for option, value in (("--candidate-model", args.candidate_model),
                              ("--candidate-attn", args.candidate_attn)):
            if value:
                what = "your port builds its own model" if candidate.kind == "port" \
                    else "the folder is the candidate's checkpoint"
                raise InputError(f"{option} works with --candidate hf or scratch; {what} "
                                 f"({candidate.spec})")


def _check_scratch_source(args: argparse.Namespace, *specs: Implementation) -> None:
    """Refuse the from-scratch BERT for a cousin named by ``--model`` before it loads.

    A random-init cousin takes seconds to build; its family is known from its name. (A
    checkpoint folder's family is read when it loads, and refused then.)
    """
    from introspect.models.families import FAMILIES, RANDOM_MODELS

    family = RANDOM_MODELS.get(str(args.model))
    if family is None or not any(spec.kind == "scratch" for spec in specs) \
            or args.head not in FAMILIES[family].heads:  # loading says the head is missing
        return
    model_class = FAMILIES[family].heads[args.head]
    raise InputError(f"the from-scratch model is a BERT; {args.model} is a {family} "
                     f"({model_class}): use --candidate hf, or pass your own port as "
                     f"--candidate FILE.py:NAME")


def compute_diff(args: argparse.Namespace, atol: float | None, rtol: float | None,
                 reference_spec: Implementation | None = None,
                 candidate_spec: Implementation | None = None) -> Any:
    """Load both models and the inputs the options name, and diff them."""
    from introspect.cli.options import load_model_and_inputs
    from introspect.cli.progress import step
    from introspect.diff.api import diff

    reference_spec = reference_spec or implementation("--reference", args.reference)
    candidate_spec = candidate_spec or implementation("--candidate", args.candidate)
    loaded, inputs = load_model_and_inputs(args)
    ports = [impl.spec for impl in (reference_spec, candidate_spec) if impl.kind == "port"]
    # a port or a --loss cannot harm the run
    before = _fingerprint(loaded.model) if ports or getattr(args, "loss", None) else None
    candidate_attn = args.candidate_attn or args.attn
    reference, reference_label = build_model(reference_spec, loaded, None, args.attn, args, before)
    candidate_label = candidate_spec.spec if candidate_spec.kind == "port" else ""

    def build_candidate() -> Any:
        """The candidate, built once the reference's truth runs and recording are taken."""
        nonlocal candidate_label
        candidate, candidate_label = build_model(candidate_spec, loaded, args.candidate_model,
                                                 candidate_attn, args, before)
        if args.candidate_dtype:
            import torch

            from introspect.diff.copies import cast_copy

            if candidate is reference:  # HF against HF in another dtype: cast a copy
                candidate = cast_copy(reference, getattr(torch, args.candidate_dtype),
                                      what=f"--candidate-dtype {args.candidate_dtype}",
                                      always=True)
            candidate = candidate.to(getattr(torch, args.candidate_dtype))
            candidate_label = f"{candidate_label}, {args.candidate_dtype}"
            _check_reference(before, loaded.model, f"--candidate-dtype {args.candidate_dtype} "
                             "cast the reference too, as the port shares its tensors (copy "
                             "them in build)")
        if candidate is reference and args.candidate_device:  # HF against HF elsewhere
            import copy

            candidate = copy.deepcopy(reference)
        deferred.label = candidate_label
        return candidate

    from introspect.models.ports import port_code
    from introspect.run.deferred import Deferred
    from introspect.run.reference import ReferenceChanged

    deferred = Deferred(build_candidate, candidate_label)
    if candidate_spec.kind != "port":  # our own code: its label is known once it is built
        deferred.build()
    with step(args, f"diffing {candidate_spec.spec} against {reference_label}"), \
            port_code(ports, "in its forward, while the diff ran it"):
        try:
            result = diff(reference, cast("torch.nn.Module", deferred), inputs,  # built in diff
                          atol=atol, rtol=rtol,
                          noise_budget=args.noise_budget, reference_label=reference_label,
                          candidate_label=deferred.label,
                          allow_nonfinite=args.allow_nonfinite,
                          backward=getattr(args, "backward", False),
                          loss=getattr(args, "loss_fn", None), device=args.device,
                          candidate_device=args.candidate_device,
                          nodes=_wants_nodes(args), **_generation_options(args, loaded))
        except ReferenceChanged:  # name what changed, where the fingerprint sees it
            _check_reference(before, loaded.model, "the port's forward changed the reference "
                             "while the diff ran it (no verdict)")
            raise
        # which head parts: for the reports, or a failure (one forward only)
        # (no recording: nothing to take heads from; a replay that did not reproduce its
        # recording: a trace of the candidate would not either, and its heads say nothing)
        if (args.out or not result.passed) and not getattr(args, "generate", 0) \
                and result.candidate is not None and result.replay_reproduced:
            from introspect.cli.attention_cmd import head_parity_for_diff

            args.head_parity = head_parity_for_diff(reference, deferred.build(), inputs, args)
    _check_reference(before, loaded.model, "the port's forward changed the reference while "
                     "the diff ran it (no verdict)")
    return result


def _wants_nodes(args: argparse.Namespace) -> bool:
    """Node tables for a report or a list that shows them (--out, --nodes, --json, --junit,
    --repro); the terminal's plain verdict takes a PASS without them where module evidence
    proves it (``diff(..., nodes=False)``)."""
    return bool(args.out or args.nodes or args.json or args.junit
                or getattr(args, "repro", None))


def _generation_options(args: argparse.Namespace, loaded: Any) -> dict[str, Any]:
    steps = getattr(args, "generate", 0)
    return {"generate": steps, "tokenizer": loaded.tokenizer} if steps else {}


def _fingerprint(model: Any) -> Any:
    from introspect.models.ports import fingerprint

    return fingerprint(model)


def _check_reference(before: Any, model: Any, what: str) -> None:
    """Raise when ``model`` no longer matches its fingerprint ``before`` (None: no port)."""
    if before is None:
        return
    from introspect.models.ports import CHANGES_WIDTH, describe_changes, what_changed

    changes = what_changed(before, _fingerprint(model), switches_too=False)  # diff() judges those
    if changes:
        raise InputError(f"{what}: {describe_changes(changes, width=CHANGES_WIDTH)}")


def _render(result: Any, args: argparse.Namespace) -> dict[str, str]:
    from introspect.report import json_report, junit_xml

    reports = {}
    if args.json:
        reports[args.json] = json_report(result)
    if args.junit:
        reports[args.junit] = junit_xml(result)
    return reports
