"""What --reference and --candidate name (hf, scratch, a folder, a port), and its model.

Shared by ``diff_cmd`` and the modes it hands over to (``dump_diff``, ``parallel_diff``),
so none of them imports another command's module.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from introspect.cli.options import say
from introspect.errors import InputError

BUILT_IN = ("hf", "scratch")
IMPLEMENTATION_HELP = ("hf, scratch, a checkpoint folder, path/to/port.py:NAME or "
                       "package.module:NAME")


@dataclass(frozen=True)
class Implementation:
    """A parsed --reference/--candidate: ``hf``, ``scratch``, a folder, or a port."""

    option: str  # --reference or --candidate
    spec: str  # as given
    kind: str  # hf, scratch, folder or port
    builder: Any = None  # a port's callable, imported but not called yet


def implementation(option: str, spec: str) -> Implementation:
    """Parse and check a --reference/--candidate value; a port is imported (not built) here.

    Raises:
        InputError: not hf or scratch, no such folder, or a port spec that does not
            resolve to a callable (see ``introspect.models.ports``).
    """
    if spec in BUILT_IN:
        return Implementation(option, spec, spec)
    from introspect.models.ports import check_port_source, is_port_spec, resolve_builder

    if is_port_spec(spec) and not os.path.isdir(spec):
        if option == "--candidate":  # imported only once the reference's truth is taken
            check_port_source(spec)
            return Implementation(option, spec, "port")
        return Implementation(option, spec, "port", resolve_builder(spec))
    if os.path.isdir(spec):
        return Implementation(option, spec, "folder")
    raise InputError(f"{option} {spec!r}: expected {IMPLEMENTATION_HELP}; no such folder")


def build_model(impl: Implementation, loaded: Any, folder: str | None, attn: str,
                args: argparse.Namespace, before: Any = None) -> tuple[Any, str]:
    """The model a parsed implementation names, built on the loaded reference.

    ``before`` is the loaded model's fingerprint, taken before any port was built.
    """
    if impl.kind == "port":
        from introspect.cli.progress import step
        from introspect.models.ports import LoadedReference, build_port

        reference = LoadedReference(loaded.model, loaded.model.config, loaded.folder,
                                    loaded.tokenizer, loaded.source, loaded.head, loaded.attn)
        builder = impl.builder
        if builder is None:  # a candidate's file: imported only now (``implementation``)
            from introspect.models.ports import resolve_builder

            builder = resolve_builder(impl.spec)
        with step(args, f"building {impl.spec}"):
            return build_port(impl.spec, builder, reference, before), impl.spec
    if impl.kind == "folder":
        return _built_in_model("hf", loaded, impl.spec, attn, args)
    return _built_in_model(impl.kind, loaded, folder, attn, args)


def _built_in_model(kind: str, loaded: Any, folder: str | None, attn: str,
                    args: argparse.Namespace) -> tuple[Any, str]:
    """The model of ``kind`` (hf or scratch) for the loaded source, or for ``folder``."""
    from introspect.cli.progress import step
    from introspect.models.load import HEADS, load_model

    source = folder or args.model
    label = f"{kind} {type(loaded.model).__name__} ({source}, {attn})"
    if kind != "hf" and (args.head not in HEADS
                         or getattr(loaded.model.config, "model_type", "bert") != "bert"):
        raise InputError(f"the from-scratch model is a BERT; {source} is a "
                         f"{loaded.model.config.model_type} ({type(loaded.model).__name__}): "
                         f"use --candidate hf, or pass your own port as --candidate FILE.py:NAME")
    if kind == "hf":
        if folder is None and attn == loaded.attn:
            return loaded.model, label
        with step(args, f"loading {source} ({args.head}, {attn})"):
            other = load_model(source, head=args.head, attn=attn)
        for note in other.notes if folder else []:
            say(args, note)
        return other.model, label
    import warnings

    from introspect.scratch import MODELS, LoadingWarning

    model_class = MODELS[HEADS[args.head]]
    checkpoint = folder or loaded.folder
    with step(args, f"building the from-scratch {HEADS[args.head]}"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", LoadingWarning)  # load_model said so already
        if checkpoint is not None:
            model = model_class.from_pretrained(checkpoint, attn_implementation=attn)
        else:
            model = model_class.from_hf(loaded.model, attn_implementation=attn)
    return model, label
