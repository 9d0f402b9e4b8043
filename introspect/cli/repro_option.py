"""``introspect diff --repro DIR``: after a FAIL, a standalone script that reproduces it.

DIR gets ``repro.py`` and ``inputs.safetensors`` (``introspect.diff.repro``): the two
sides' ops at the first divergence, as plain torch calls on the values recorded there.
A passing diff writes nothing and says so; a failure that is not at a node (the plain
calls' outputs, drift) says why there is no repro and keeps exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from introspect.errors import InputError

# introspect.diff.repro.REPRO_FILES, kept here so that --help never imports torch.
REPRO_FILES = ("repro.py", "inputs.safetensors")
# Modes whose failure is not one forward's node: what --repro would have to reproduce.
_NOT_WITH = {"generate": "--generate (reproduce the failing step's prefix without it)",
             "backward": "--backward (the repro replays the forward)",
             "nproc": "--nproc (the ranks' ops ran in other processes)",
             "candidate_dump": "--candidate-dump (a file of activations has no ops to run)",
             "reference_dump": "--reference-dump (a file of activations has no ops to run)"}


def add_repro_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repro", metavar="DIR",
                        help="on failure, write DIR/repro.py and DIR/inputs.safetensors: a "
                             "script that needs only torch and safetensors, runs both sides' "
                             "ops at the first divergence on the recorded values, prints "
                             "their errors and exits 1 when they part")


def check_repro(args: argparse.Namespace) -> None:
    """The cheap checks of --repro, before anything loads: the modes it cannot serve, and
    a folder that cannot be written."""
    folder = getattr(args, "repro", None)
    if folder is None:
        return
    for option, shown in _NOT_WITH.items():
        if getattr(args, option, None):
            raise InputError(f"--repro does not mix with {shown}")
    if not folder or folder == "-":
        raise InputError("--repro takes a folder (it writes repro.py and inputs.safetensors)")
    from introspect.files import check_writable_folder

    check_writable_folder(folder, REPRO_FILES)


@dataclass(frozen=True)
class ReproNote:
    """What --repro has to say, once the verdict is printed."""

    text: str
    warning: bool = False  # on stderr, even under --quiet: a failure without a repro


def write_repro_folder(result: Any, args: argparse.Namespace) -> ReproNote | None:
    """Write the repro of a failing diff into --repro's folder; what to tell the user.

    Raises:
        InputError: the folder cannot be written (nothing is).
    """
    folder = getattr(args, "repro", None)
    if folder is None:
        return None
    from introspect.diff.repro import NothingToReproduce, ReproError, write_repro

    try:
        write_repro(result, folder)
    except NothingToReproduce as e:  # a pass is no news; a failure without a repro is
        return ReproNote(f"repro: {e}", warning=not result.passed)
    except ReproError as e:  # the verdict stands (exit 1); only the repro is missing
        return ReproNote(f"repro: not written: {e}", warning=True)
    script = os.path.join(folder, "repro.py")
    return ReproNote(f"repro: {script} and inputs.safetensors (run: python {script})")


def tell_repro(note: ReproNote | None, stream: TextIO, *, quiet: bool = False) -> None:
    """Print ``note`` after the verdict (a warning on stderr, whatever --quiet says)."""
    if note is None:
        return
    if note.warning:
        sys.stderr.write(note.text + "\n")
    elif not quiet:
        stream.write(note.text + "\n")


__all__ = ["REPRO_FILES", "ReproNote", "add_repro_argument", "check_repro", "tell_repro",
           "write_repro_folder"]
