"""Options shared by the subcommands, and the one place that loads model and inputs."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

# Kept here (not imported from introspect.models.load) so that --help never imports torch.
MODEL_HELP = ("minilm (default, real pretrained), bert-tiny, bert-base, bert-large, "
              "roberta-base, distilbert-base, electra-small, albert-base, gpt2, llama-tiny "
              "(random-init), or a checkpoint folder of these families")
HEAD_CHOICES = ("base", "sequence-classification", "masked-lm", "token-classification",
                "question-answering", "multiple-choice", "next-sentence", "pretraining",
                "causal-lm")
DEFAULT_TEXTS = ("I love cats!", "He hates pineapple pizza.")
# introspect diff's default: two sentence pairs of different lengths, so that the batch is
# padded (the attention mask is exercised) and token_type_ids holds both segments.
DEFAULT_PAIRS = (("I love cats!", "He hates pineapple pizza."),
                 ("Time flies like an arrow.", "Fruit flies like a banana."))
# Options that take a number as text, parsed later by the code they feed: checked up front
# by check_numbers, so that a digit other than 0-9 is a usage error wherever it goes.
NUMBER_OPTIONS = {"atol": "--atol", "rtol": "--rtol", "generate": "--generate",
                  "nproc": "--nproc", "nproc_timeout": "--nproc-timeout"}


class NotANumber(argparse.ArgumentTypeError, ValueError):
    """A ValueError for callers that say their own message, argparse's message otherwise."""


def whole_number(text: str) -> int:
    """``int(text)`` for ASCII digits only; ``NotANumber`` (a ValueError) otherwise.

    ``int`` reads any Unicode decimal digit (``int('١')`` is 1) and refuses others that
    ``str.isdigit`` accepts (``'²'``), so a check on ``isdigit`` lets ``'²'`` through to an
    internal error; a number on a command line is written in 0-9.
    """
    try:
        if text.isascii():
            return int(text)
    except ValueError:
        pass
    raise NotANumber(f"expected a whole number in ASCII digits (0-9), not {text[:40]!r}")


def check_numbers(args: argparse.Namespace) -> None:
    """Refuse a number option (``NUMBER_OPTIONS``) written with characters other than ASCII.

    Raises:
        InputError: ``--nproc ²``, ``--atol ١`` and the like, naming the option.
    """
    from introspect.errors import InputError

    for dest, option in NUMBER_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and not value.isascii():
            raise InputError(f"{option} takes a number written in ASCII (0-9, '.', 'e'), "
                             f"got {value[:40]!r}")


def add_model_options(parser: argparse.ArgumentParser, *, head_default: str = "base") -> None:
    parser.add_argument("--model", default="minilm", metavar="M", help=MODEL_HELP)
    parser.add_argument("--head", default=head_default, choices=HEAD_CHOICES, metavar="H",
                        help=f"one of: {', '.join(HEAD_CHOICES)} (default: {head_default})")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="HF attention implementation (default: sdpa)")
    parser.add_argument("--text", action="append", metavar="T",
                        help="input text, repeatable (default: the tutorial's two sentences)")


def add_text_pair_option(parser: argparse.ArgumentParser) -> None:
    """--text-pair A B (repeatable), and sentence pairs as the command's default input."""
    for action in parser._actions:  # the default input differs from the other commands'
        if action.dest == "text":
            action.help = "input text, one row each, repeatable (default: see --text-pair)"
    parser.add_argument("--text-pair", nargs=2, action="append", metavar=("A", "B"),
                        help="a sentence pair, one row [CLS] A [SEP] B [SEP], repeatable; not "
                             "with --text (default: the pairs 'I love cats!' / 'He hates "
                             "pineapple pizza.' and 'Time flies like an arrow.' / 'Fruit "
                             "flies like a banana.': padded, both segments)")
    parser.set_defaults(default_pairs=DEFAULT_PAIRS)


@contextlib.contextmanager
def quiet_libraries(args: argparse.Namespace) -> Iterator[None]:
    """Under -q, transformers says nothing but errors (its logging and its warnings).

    Its long-input advice, deprecation notes and load reports are noise to a run that
    prints its verdict only; the settings are put back after, so ``main()`` called twice
    in one process (a notebook, the tests) leaves them as they were.
    """
    if not getattr(args, "quiet", False):
        yield
        return
    from transformers.utils import logging as hf_logging  # not torch: cheap enough for -q

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"transformers(\.|$)")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def add_verbosity_options(parser: argparse.ArgumentParser, *,
                          quiet_help: str = "print only errors") -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    group.add_argument("-v", "--verbose", action="store_true",
                       help="say what happens, with timings")


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """--device and --candidate-device (introspect diff: where each model runs)."""
    parser.add_argument("--device", metavar="D",
                        help="run both models on this device: cpu, cuda, cuda:1 (default: cpu)")
    parser.add_argument("--candidate-device", metavar="D",
                        help="run the candidate alone on this device (the reference stays on "
                             "--device); values are compared on the reference's device, "
                             "moved there one pair at a time")


def check_devices(args: argparse.Namespace) -> None:
    """--device/--candidate-device name devices this machine has, in a mode that takes them.

    Raises:
        InputError: an unknown name, CUDA absent, activation dumps or --generate.
    """
    device, candidate_device = getattr(args, "device", None), getattr(args, "candidate_device",
                                                                      None)
    if device is None and candidate_device is None:
        return
    from introspect.errors import InputError

    if getattr(args, "candidate_dump", None) or getattr(args, "reference_dump", None):
        raise InputError("--device and --candidate-device run models; activation dumps hold "
                         "values already computed")
    from introspect.diff.devices import check_modes, parse_device

    parse_device(device, "--device")
    parse_device(candidate_device, "--candidate-device")
    check_modes(device, candidate_device, getattr(args, "generate", 0),
                getattr(args, "backward", False))


def add_backward_options(parser: argparse.ArgumentParser) -> None:
    """--backward and --loss (introspect diff: gradient parity)."""
    parser.add_argument("--backward", action="store_true",
                        help="also compare gradients: every aligned node's, every weight's, "
                             "and one SGD step (the loss: the head's own, with seeded labels)")
    parser.add_argument("--loss", metavar="FILE.py:NAME",
                        help="with --backward: a callable loss(outputs, inputs) -> scalar used "
                             "for both sides (path/to/file.py:NAME or package.module:NAME)")


def backward_loss(args: argparse.Namespace) -> Any:
    """The --loss callable, imported (None without --loss); --loss needs --backward.

    Raises:
        InputError: --loss without --backward, or a spec that names no callable.
    """
    from introspect.errors import InputError

    spec = getattr(args, "loss", None)
    if spec is None:
        return None
    if not getattr(args, "backward", False):
        raise InputError("--loss works with --backward only")
    from introspect.models.ports import is_port_spec, resolve_builder

    if not is_port_spec(spec):
        raise InputError(f"--loss {spec!r}: expected path/to/file.py:NAME or "
                         "package.module:NAME naming loss(outputs, inputs) -> scalar")
    return guarded_loss(spec, resolve_builder(spec, "--loss"))


def guarded_loss(spec: str, loss: Any) -> Any:
    """The user's loss, run as a port's code is (``ports.port_code``): its exits and
    interrupts are one line and exit 2, its prints go to stderr."""
    from introspect.errors import InputError
    from introspect.models.ports import port_code

    def run_loss(outputs: Any, inputs: Any) -> Any:
        before = _global_hooks()
        with port_code([spec], "while the backward diff ran it", kind="--loss"):
            value = loss(outputs, inputs)
        added = [kind for kind, keys in _global_hooks().items() if keys != before.get(kind)]
        if added:
            _remove_hooks_since(before)
            raise InputError(f"--loss {spec!r} changed torch's global {', '.join(added)} "
                             "(every later forward would run them); no verdict: a loss only "
                             "reads the outputs")
        return value

    run_loss.__name__ = getattr(loss, "__name__", "loss")
    return run_loss


def _global_hooks() -> dict[str, tuple[int, ...]]:
    """The ids of torch's global module hooks, by kind (forward hooks, backward hooks...)."""
    from torch.nn.modules import module

    return {name.removeprefix("_global_").replace("_", " "): tuple(hooks)
            for name, hooks in vars(module).items()
            if name.startswith("_global_") and isinstance(hooks, dict)}


def _remove_hooks_since(before: dict[str, tuple[int, ...]]) -> None:
    """Take out the global hooks registered since ``before``: the run is refused, and the
    process (a notebook, a test session) must not keep running them."""
    from torch.nn.modules import module

    for name, hooks in vars(module).items():
        kind = name.removeprefix("_global_").replace("_", " ")
        if name.startswith("_global_") and isinstance(hooks, dict):
            for key in [k for k in hooks if k not in before.get(kind, ())]:
                del hooks[key]


def check_texts(texts: list[str] | None, pairs: list[list[str]] | None = None) -> None:
    """Refuse an empty text, one that is not valid UTF-8, or --text mixed with --text-pair,
    before any model is loaded.

    Raises:
        InputError: naming the text by its position (or its pair and side).
    """
    from introspect.errors import InputError

    if texts and pairs:
        raise InputError("--text and --text-pair do not mix in one batch: give every row as "
                         "--text-pair A B, or use only --text")
    named = [(f"text {i}", text) for i, text in enumerate(texts or (), 1)]
    named += [(f"pair {i}'s {side} text", text) for i, pair in enumerate(pairs or (), 1)
              for side, text in zip(("first", "second"), pair, strict=True)]
    for name, text in named:
        try:
            text.encode("utf-8")  # undecodable argv bytes arrive as lone surrogates
        except UnicodeEncodeError as e:
            raise InputError(f"{name} is not valid UTF-8 (byte "
                             f"0x{ord(text[e.start]) & 0xFF:02x} at position {e.start}); "
                             "pass UTF-8 text") from e
        if not text.strip():
            option = "--text" if name.startswith("text") else "--text-pair"
            raise InputError(f"{name} is empty; give every {option} some words")


def input_texts(args: argparse.Namespace) -> tuple[tuple[str, ...], bool]:
    """The texts to tokenize, in order, and whether they go two by two as sentence pairs.

    --text-pair, else --text, else the command's default: sentence pairs for
    ``introspect diff`` (``add_text_pair_option``), the tutorial's two sentences elsewhere.
    """
    pairs = getattr(args, "text_pair", None)
    check_texts(args.text, pairs)
    if pairs:
        return tuple(text for pair in pairs for text in pair), True
    if args.text:
        return tuple(args.text), False
    default_pairs = getattr(args, "default_pairs", None)
    if default_pairs:
        return tuple(text for pair in default_pairs for text in pair), True
    return DEFAULT_TEXTS, False


def say(args: argparse.Namespace, message: str) -> None:
    """A notice on stderr, unless --quiet."""
    if not getattr(args, "quiet", False):
        sys.stderr.write(f"introspect: {message}\n")


def load_model_and_inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the model named by --model/--head/--attn and tokenize the texts, telling notes.

    Sentence pairs (--text-pair, or the command's default pairs) are tokenized as
    ``[CLS] A [SEP] B [SEP]``, one row each; under the multiple-choice head, each pair is
    one choice.
    """
    from introspect.cli.progress import step
    from introspect.models.load import load_model, tokenize
    from introspect.models.validate import check_texts

    texts, paired = input_texts(args)
    check_texts(texts, head="next-sentence" if paired else args.head)  # before the slow part
    with step(args, f"loading {args.model} ({args.head}, {args.attn})"):
        loaded = load_model(args.model, head=args.head, attn=args.attn)
    max_length = int(getattr(loaded.model.config, "max_position_embeddings", 512))
    inputs = tokenize(loaded.tokenizer, texts, head="next-sentence" if paired else args.head,
                      max_length=max_length)
    if paired and args.head == "multiple-choice":  # the pairs are the choices: (1, C, S)
        import dataclasses

        inputs = dataclasses.replace(inputs, tensors={
            name: tensor.unsqueeze(0) for name, tensor in inputs.tensors.items()})
    for note in [*loaded.notes, *inputs.notes]:
        if getattr(args, "generate", None) and "use_cache=False" in note:
            continue  # --generate decodes with each side's own cache: the note would mislead
        say_note(args, note)
    return loaded, inputs


def say_note(args: argparse.Namespace, note: str) -> None:
    """A loading note on stderr; that a head's weights were initialised (every run of a
    task head on a base checkpoint: ``make demo`` would say it six times) only under
    --verbose."""
    if " weights not in the checkpoint were initialised with seed " in note and \
            not getattr(args, "verbose", False):
        return
    say(args, note)
