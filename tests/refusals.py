"""What the tests ask of a refusal the CLI prints: one line under 200 characters, with the
values the user gave whole, or, where the line would be longer, shortened to their ends
(``introspect.cli.refusal.one_line``: ``/tmp/…/checkpoint/model.safetensors``)."""

from __future__ import annotations

import re
from typing import Any


def cli_refusal(argv: list[str], capsys: Any) -> tuple[int, str]:
    """``introspect ARGV`` run in this process: its exit status (argparse's own refusals
    included) and what it wrote to stderr."""
    from introspect.cli.main import main

    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    return code, capsys.readouterr().err


def shows(value: str, line: str) -> bool:
    """``line`` names ``value`` (a path, a port spec): whole, or by its ends: its first
    folder, ``…``, whole folders at its end and its last name (at the shortest, ``…/`` and
    its last name)."""
    if value in line:
        return True
    if len(value) > 1 and value.endswith("/"):  # a folder: its last name with the slash
        folder = value.rstrip("/")
        return shows(folder, line) and f"{folder.rsplit('/', 1)[-1]}/" in line
    names = value.split("/")
    first = next((i for i, name in enumerate(names) if name not in ("", "~", ".", "..")), 0)
    head, last = "/".join(names[:first + 1]), names[-1]
    ends = rf"(?:{re.escape(head)}/)?…/(?:[^\s/'\"]+/)*{re.escape(last)}"
    return len(names) > first + 1 and re.search(ends, line) is not None
