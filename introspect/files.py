"""Writing files atomically: a temp file in the same folder, then a rename.

An interrupted run or a failed check leaves no half-written report behind, and the
previous version of the file stays intact until the new one is complete.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from introspect.errors import InputError


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Fail early, before any model work, if ``path`` cannot be written.

    Raises:
        InputError: the folder does not exist, is not a folder, or is not writable;
            or ``path`` is itself a folder.
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise InputError(f"output path {str(target)!r} is a folder; give a file name")
    if not folder.is_dir():
        raise InputError(f"cannot write {str(target)!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {str(target)!r}: folder {str(folder)!r} is not writable")
    return target


def check_writable_folder(path: str | os.PathLike[str]) -> Path:
    """Like ``check_writable`` for an output folder, which is created if its parent exists."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"output folder {str(folder)!r} is a file")
    parent = folder.parent if str(folder.parent) else Path(".")
    if not folder.exists() and not parent.is_dir():
        raise InputError(f"cannot create output folder {str(folder)!r}: "
                         f"{str(parent)!r} does not exist")
    if not os.access(folder if folder.exists() else parent, os.W_OK):
        raise InputError(f"output folder {str(folder)!r} is not writable")
    return folder


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temp file and a rename; return the path."""
    target = check_writable(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    descriptor, temp_name = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.",
                                             suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return target
