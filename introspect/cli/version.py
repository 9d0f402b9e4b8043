"""``introspect --version``: the versions a bug report needs, read without importing torch."""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from introspect.version import __version__

DISTRIBUTION = "introspect-bert"


def version_text() -> str:
    """introspect, Python, torch, transformers and Graphviz's dot, one per line."""
    lines = [f"introspect {__version__} ({DISTRIBUTION})",
             f"Python {platform.python_version()} ({sys.executable})"]
    for package in ("torch", "transformers"):
        try:
            lines.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{package} not installed")
    lines.append(f"Graphviz dot {dot_version()}")
    return "\n".join(lines)


def dot_version() -> str:
    """``dot -V``'s version, or why there is none."""
    dot = shutil.which("dot")
    if dot is None:
        return "not found on PATH (drawings need it)"
    try:
        done = subprocess.run([dot, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"at {dot}, but 'dot -V' failed: {e}"
    words = (done.stderr or done.stdout).split()  # "dot - graphviz version 2.43.0 (0)"
    version = words[words.index("version") + 1] if "version" in words else "unknown version"
    return f"{version} ({dot})"


class VersionAction(argparse.Action):
    """--version: print ``version_text()`` and exit 0 (computed only when asked)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the versions of introspect, Python, torch, "
                                  "transformers and Graphviz, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        sys.stdout.write(version_text() + "\n")
        parser.exit(0)
