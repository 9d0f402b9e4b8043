"""Rendering a drawing to bytes (SVG, PNG, PDF, DOT) and writing it atomically.

DOT needs nothing but Python; the other formats run Graphviz's ``dot`` binary. A missing
``dot``, an unknown format or an unwritable path is an ``IntrospectError`` (one line and
exit 2 in the CLI), and no partial file is ever left behind. The same drawing gives the
same bytes in every format: a PDF's creation date is fixed (``fixed_pdf_dates``).

Example::

    >>> write_drawing(graph.draw(depth=1), "bert.svg")
    PosixPath('bert.svg')
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from introspect.errors import InputError, IntrospectError

FORMATS = ("svg", "png", "pdf", "dot")
_EXTENSIONS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}


class GraphvizMissingError(IntrospectError):
    """Graphviz's ``dot`` program is not installed or not on PATH."""


def format_for(path: str | os.PathLike[str] | None, fmt: str | None = None) -> str:
    """The output format: ``fmt`` when given, else from the file's extension, else svg.

    Raises:
        InputError: an unknown format or extension, quoting it.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise InputError(f"unknown drawing format {fmt!r}; use one of {', '.join(FORMATS)}")
        return fmt
    if path is None or str(path) == "-":
        return "svg"
    suffix = Path(path).suffix.lower()
    if suffix not in _EXTENSIONS:
        raise InputError(
            f"cannot tell the drawing format from {str(path)!r}; end the file "
            f"name in .svg, .png, .pdf or .dot, or pass --format"
        )
    return _EXTENSIONS[suffix]


def require_dot(fmt: str = "svg") -> None:
    """Fail early when ``fmt`` needs Graphviz's ``dot`` and it cannot be found.

    Raises:
        GraphvizMissingError: ``dot`` is not on PATH.
    """
    if fmt != "dot" and shutil.which("dot") is None:
        raise GraphvizMissingError(
            "Graphviz's 'dot' program was not found on PATH; install Graphviz "
            "(apt-get install graphviz, brew install graphviz) or write DOT with -o FILE.dot"
        )


def render_bytes(digraph: Any, fmt: str = "svg") -> bytes:
    """``digraph`` (a graphviz.Digraph or Source) rendered in memory as ``fmt``.

    Raises:
        InputError: an unknown format. GraphvizMissingError: no ``dot``.
        IntrospectError: ``dot`` failed (its message is quoted).
    """
    fmt = format_for(None, fmt)
    if fmt == "dot":
        return digraph.source.encode("utf-8")
    require_dot(fmt)
    import graphviz

    try:
        data = bytes(digraph.pipe(format=fmt, quiet=True))  # its stderr goes in the error
        return fixed_pdf_dates(data) if fmt == "pdf" else data
    except graphviz.ExecutableNotFound as e:
        raise GraphvizMissingError(f"Graphviz's 'dot' could not be run: {e}") from e
    except (graphviz.CalledProcessError, subprocess.CalledProcessError) as e:
        stderr = getattr(e, "stderr", b"") or b""
        message = stderr.decode("utf-8", "replace").strip().splitlines()
        raise IntrospectError(
            f"Graphviz failed to render {fmt}: {message[-1] if message else e}"
        ) from e


# cairo writes the time of rendering into a PDF's info dictionary; its 14 digits are
# replaced by a fixed time of the same length, so the byte offsets of the xref table hold.
_PDF_DATE = re.compile(rb"(/(?:CreationDate|ModDate) *\(D:)(\d{14})")


def fixed_pdf_dates(pdf: bytes) -> bytes:
    """A PDF with its creation and modification dates fixed: byte-identical across runs.

    The date is ``SOURCE_DATE_EPOCH`` (the reproducible-builds convention) when set and
    valid, else 1970-01-01 00:00:00 UTC.
    """
    try:
        epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(epoch)).encode("ascii")
    except (ValueError, OverflowError, OSError):
        stamp = b"19700101000000"
    if len(stamp) != 14:
        stamp = b"19700101000000"
    return _PDF_DATE.sub(lambda m: m.group(1) + stamp, pdf)


def write_drawing(digraph: Any, path: str | os.PathLike[str], fmt: str | None = None) -> Path:
    """Render ``digraph`` and write it to ``path`` atomically; the format follows the name.

    Returns:
        The path written.

    Raises:
        InputError: unknown format, or a path that cannot be written.
        GraphvizMissingError: the format needs ``dot`` and it is missing.
    """
    from introspect.files import check_writable, write_file

    fmt = format_for(path, fmt)
    check_writable(path)
    return write_file(path, render_bytes(digraph, fmt))
