"""Write the example ports, losses, scripts and CI recipes into a folder, to run and edit.

Examples:
  introspect examples                  # ./examples, as the documentation's commands expect
  introspect examples my-examples      # another folder
  introspect diff --candidate examples/ci/faulty_port.py:build   # then: a port that fails

The files ship inside the package (introspect/examples in the wheel; examples/ in a
checkout), so every command of the README and the documentation runs from a wheel:
ci/my_port.py (a BERT written without introspect), ci/faulty_port.py (the same with a tanh
GELU in layer 3), ci/my_loss.py (a loss for --backward), generation/gpt2_cached.py (a
GPT-2 with its own cache), numpy_port/bert_numpy.py (a port in NumPy), onnx_runtime/ and
keras_jax/ (two runtimes), the CI recipes, small scripts and the notebooks.

DIR must not exist or be empty: nothing is overwritten. The folder appears complete or
not at all; an empty folder keeps its mode (a private 0700 folder stays private).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from introspect.cli.options import add_verbosity_options, say

DEFAULT_FOLDER = "examples"
LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", nargs="?", default=DEFAULT_FOLDER,
                        help=f"the folder to write (default: ./{DEFAULT_FOLDER}); it must not "
                             "exist or be empty")
    add_verbosity_options(parser)


def shipped_examples() -> Path:
    """The examples this install carries: the wheel's ``introspect/examples``, or a
    checkout's ``examples/`` (run from the source tree, they are not copied into it)."""
    from introspect.errors import InputError

    package = Path(__file__).resolve().parents[1]
    for folder in (package / "examples", package.parent / "examples"):
        if (folder / "ci" / "my_port.py").is_file():
            return folder
    raise InputError(f"this install of introspect carries no examples (looked in "
                     f"{package / 'examples'}); reinstall it from a wheel or a checkout")


def run(args: argparse.Namespace) -> int:
    from introspect.errors import InputError

    target = Path(args.folder)
    if target.exists() and not target.is_dir():
        raise InputError(f"{args.folder!r} exists and is not a folder; choose a new folder "
                         "name")
    if target.is_dir() and any(target.iterdir()):
        raise InputError(f"{args.folder!r} exists and is not empty; the examples are written "
                         "only into a new or empty folder (nothing was changed)")
    source = shipped_examples()
    parent = target.resolve().parent
    if not parent.is_dir():
        raise InputError(f"the folder {str(parent)!r} does not exist; create it first")
    try:
        temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.introspect-examples-", dir=parent))
    except OSError as e:
        raise InputError(f"cannot write into {str(parent)!r}: {e.strerror or e}") from e
    try:
        shutil.copytree(source, temp, ignore=LEFT_OUT, dirs_exist_ok=True)
        # an empty folder of the user's keeps its mode (0700 stays private); a new one
        # gets what mkdir would give it
        os.chmod(temp, stat.S_IMODE(target.stat().st_mode) if target.is_dir()
                 else 0o777 & ~_umask())
        if target.is_dir():
            target.rmdir()  # empty, checked above; a rename cannot replace it everywhere
        os.rename(temp, target)
    except OSError as e:
        raise InputError(f"cannot write the examples into {args.folder!r}: "
                         f"{e.strerror or e}; nothing was written") from e
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(temp)
    count = sum(1 for p in target.rglob("*") if p.is_file())
    say(args, f"wrote {count} files into {args.folder}{os.sep}: try "
              f"'introspect diff --candidate {Path(args.folder, 'ci', 'faulty_port.py')}:build'")
    return 0


def _umask() -> int:
    """The process's umask (read by setting it, as POSIX offers no other way)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
