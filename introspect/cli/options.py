"""Options shared by the subcommands, and the one place that loads model and inputs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

# Kept here (not imported from introspect.load) so that --help never imports torch.
MODEL_HELP = ("minilm (default, real pretrained), bert-tiny, bert-base, bert-large, "
              "roberta-base, distilbert-base, electra-small, albert-base, gpt2, llama-tiny "
              "(random-init), or a checkpoint folder of these families")
HEAD_CHOICES = ("base", "sequence-classification", "masked-lm", "token-classification",
                "question-answering", "multiple-choice", "next-sentence", "pretraining",
                "causal-lm")
DEFAULT_TEXTS = ("I love cats!", "He hates pineapple pizza.")


def add_model_options(parser: argparse.ArgumentParser, *, head_default: str = "base") -> None:
    parser.add_argument("--model", default="minilm", metavar="M", help=MODEL_HELP)
    parser.add_argument("--head", default=head_default, choices=HEAD_CHOICES, metavar="H",
                        help=f"one of: {', '.join(HEAD_CHOICES)} (default: {head_default})")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                        help="HF attention implementation (default: sdpa)")
    parser.add_argument("--text", action="append", metavar="T",
                        help="input text, repeatable (default: the tutorial's two sentences)")


def add_verbosity_options(parser: argparse.ArgumentParser, *,
                          quiet_help: str = "print only errors") -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    group.add_argument("-v", "--verbose", action="store_true",
                       help="say what happens, with timings")


def check_texts(texts: list[str] | None) -> None:
    """Refuse an empty --text or one that is not valid UTF-8, before any model is loaded.

    Raises:
        InputError: naming the text by its position.
    """
    from introspect.errors import InputError

    for i, text in enumerate(texts or (), 1):
        try:
            text.encode("utf-8")  # undecodable argv bytes arrive as lone surrogates
        except UnicodeEncodeError as e:
            raise InputError(f"text {i} is not valid UTF-8 (byte "
                             f"0x{ord(text[e.start]) & 0xFF:02x} at position {e.start}); "
                             "pass UTF-8 text") from e
        if not text.strip():
            raise InputError(f"text {i} is empty; give every --text some words")


def say(args: argparse.Namespace, message: str) -> None:
    """A notice on stderr, unless --quiet."""
    if not getattr(args, "quiet", False):
        sys.stderr.write(f"introspect: {message}\n")


def load_model_and_inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the model named by --model/--head/--attn and tokenize --text, telling notes."""
    from introspect.cli.progress import step
    from introspect.load import load_model, tokenize
    from introspect.validate import check_texts

    check_texts(args.text or DEFAULT_TEXTS, head=args.head)  # before the slow part
    with step(args, f"loading {args.model} ({args.head}, {args.attn})"):
        loaded = load_model(args.model, head=args.head, attn=args.attn)
    max_length = int(getattr(loaded.model.config, "max_position_embeddings", 512))
    inputs = tokenize(loaded.tokenizer, args.text or DEFAULT_TEXTS, head=args.head,
                      max_length=max_length)
    for note in [*loaded.notes, *inputs.notes]:
        say(args, note)
    return loaded, inputs
