"""Progress for slow steps: a spinner on a terminal, silence in CI and in pipes.

``--verbose`` prints each step with its time, even when stderr is not a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator


def _interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


@contextlib.contextmanager
def step(args: argparse.Namespace, message: str) -> Iterator[None]:
    """Show ``message`` while the block runs; with --verbose, its time when it ends."""
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)
    start = time.perf_counter()
    if quiet or not (verbose or _interactive()):
        yield
        return
    if _interactive():
        from rich.console import Console

        with Console(stderr=True).status(f"{message} ..."):
            yield
    else:
        yield
    if verbose:
        sys.stderr.write(f"introspect: {message}: {time.perf_counter() - start:.2f} s\n")
