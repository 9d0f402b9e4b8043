"""Where a command's output goes: ``-`` is stdout, anything else a file written by files.py.

Every file option (``trace -o``, ``draw -o``, ``diff --json``, ``--junit``) goes through
here, so that ``-`` means stdout everywhere and all paths are checked together, before
any model is loaded: a report that goes to stdout leaves stdout to itself (the human
verdict moves to stderr), two reports never share a path, and a file inside the ``--out``
folder is fine even though the folder does not exist yet.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TextIO

from introspect.errors import InputError

STDOUT = "-"


def is_stdout(path: str | None) -> bool:
    return path == STDOUT


def _refuse_set_names(given: Mapping[str, str], folder: str, names: set[str],
                      own: Mapping[str, str]) -> None:
    """A file option may not name another file of the --out set (``--json rep/nodes.csv``):
    the set replaces its files as a whole, and of two writers the last one wins. The same
    report to both (``--junit rep/junit.xml``, as CI setups write it) is the same bytes."""
    inside = Path(os.path.realpath(folder))
    for option, path in given.items():
        if is_stdout(path):
            continue
        target = Path(os.path.realpath(path))
        if target.parent == inside and target.name in names and own.get(option) != target.name:
            raise InputError(f"{option} {path!r} is inside --out {folder}, whose report set "
                             f"writes {target.name} itself: drop {option}, or give it a path "
                             "outside that folder")


def check_outputs(files: Mapping[str, str | None], *, folder: str | None = None,
                  folder_files: Mapping[str, str] | None = None,
                  folder_names: Iterable[str] = ()) -> None:
    """Refuse outputs that cannot all be written, before any slow work.

    Args:
        files: option name (``--json``) -> the path it was given (None when not given).
        folder: the ``--out`` folder, created later if its parent exists.
        folder_files: option name -> the file name that option's report has in ``folder``
            (the same report may go to both; another report to the same path may not).
        folder_names: every file name the folder's report set may hold (each must be
            replaceable: a folder or a device under one of these names is refused).

    Raises:
        InputError: two outputs on stdout, one path given to two reports, or a path that
            cannot be written.
    """
    from introspect.files import check_writable, check_writable_folder

    given = {option: path for option, path in files.items() if path}
    on_stdout = [option for option, path in given.items() if is_stdout(path)]
    if len(on_stdout) > 1:
        raise InputError(f"{' and '.join(on_stdout)} both go to stdout ('-'); only one report "
                         "can, give the other a file name")
    owners: dict[Path, str] = {}
    if folder:
        check_writable_folder(folder, folder_names)
        for option, name in (folder_files or {}).items():
            owners[_absolute(Path(folder) / name)] = option
    for option, path in given.items():
        if is_stdout(path):
            continue
        target = _absolute(Path(path))  # type: ignore[arg-type]
        owner = owners.get(target)
        if owner is not None and owner != option:
            in_folder = bool(folder) and target.parent == _absolute(Path(folder or "."))
            both = (f"{option} and the {owner} report in --out {folder}" if in_folder
                    else f"{owner} and {option}")
            raise InputError(f"{both} name the same file {path!r}; "
                             "give each report its own path")
        owners[target] = option
        if folder and target.parent == _absolute(Path(folder)) and not Path(folder).is_dir():
            continue  # --out creates the folder first; check_writable_folder vouched for it
        check_writable(path)  # type: ignore[arg-type]
    if folder:
        _refuse_set_names(given, folder, set(folder_names), folder_files or {})


def write_output(path: str, data: str | bytes) -> None:
    """Write ``data`` to stdout for ``-``, else to the file (files.py: atomic, devices in
    place; a failed write is one ``InputError`` line)."""
    from introspect.files import write_file

    write_file(path, data)


def human_stream(*paths: str | None) -> TextIO:
    """Where text meant for a person goes: stderr when a report holds stdout, else stdout."""
    return sys.stderr if any(is_stdout(p) for p in paths) else sys.stdout


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))
