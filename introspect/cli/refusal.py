"""A refusal as one line under 200 characters: its values shortened before its words.

A refusal is read in a terminal and in a CI log's last lines. Over the limit, the values
it names (paths, quoted values) keep their ends, longest first and a step shorter at a
time, until the line fits; only a line still too long loses words in its middle.

Example::

    >>> one_line("introspect diff: error: port '/data/" + "x" * 300 + "/port.py:build': "
    ...          "no such file; give path/to/port.py:NAME")
    "introspect diff: error: port '/data/…/port.py:build': no such file; give path/to/port.py:NAME"
"""

from __future__ import annotations

import re

LINE_LIMIT = 199  # characters of a refusal: a terminal's line or two, a CI log's last line
# How short a value gets, a step at a time: a path keeps its first folder and whole names
# at its end within the first number of characters (at least the last name; at 0, the
# last name alone); a quoted value keeps its first and its last characters, the second
# number of each.
_STEPS = ((40, 28), (24, 14), (16, 8), (0, 8))
_NAME = 40  # characters of a name kept whole at every step: a file's, a port's, a choice's
# A quoted value: no space inside (else the quote closing one value and the next opening
# one would pass for a value between them).
_QUOTED = re.compile(r"'([^'\s]+)'")
# A path in a message: from a slash to the next space, quote, bracket, comma or semicolon.
_PATH = re.compile(r"(?<![\w.~])(?:~|\.\.?)?/[^\s'\"(),;]+")
_ROOTS = ("", "~", ".", "..")  # what comes before a path's first folder


def one_line(text: str) -> str:
    """``text`` on one line of at most ``LINE_LIMIT`` characters.

    A line that fits is ``text`` with its whitespace runs made single spaces. Past the
    limit, its paths and quoted values are shortened, longest first, in ``_STEPS``: a path
    to ``/tmp/…/checkpoint/model.safetensors``, a quoted value to ``'abc…xyz'``. A line
    still too long then loses words in its middle, keeping its start (what failed) and
    its end (what to do next).
    """
    line = " ".join(text.split())
    for path_end, quoted_end in _STEPS:
        values = set(_QUOTED.findall(line)) | set(_PATH.findall(line))
        for value in sorted(values, key=len, reverse=True):
            if len(line) <= LINE_LIMIT:
                return line
            short = _path_ends(value, path_end) if "/" in value else _ends(value, quoted_end)
            if len(short) < len(value):
                line = line.replace(value, short)
    return line if len(line) <= LINE_LIMIT else _middle_cut(line)


def _middle_cut(line: str) -> str:
    """``start … end``, each half cut between words where a space is near (within a
    quarter of it), else within a word."""
    half = (LINE_LIMIT - 3) // 2
    start, end = line[:half], line[-half:]
    if " " in start[half // 2:]:
        start = start[:start.rindex(" ")]
    if " " in end[:half // 2]:
        end = end[end.index(" ") + 1:]
    return f"{start} … {end}"


def _ends(value: str, keep: int) -> str:
    """``abc…xyz``: ``keep`` characters of each end (a name of up to ``_NAME`` whole)."""
    if len(value) <= max(2 * keep + 1, _NAME):
        return value
    return f"{value[:keep]}…{value[-keep:]}"


def _path_ends(path: str, end: int) -> str:
    """``/tmp/…/checkpoint/model.safetensors``: the first folder (its first ``end``
    characters), then whole names at the end within ``end`` characters, at least the last
    name (its last ``_NAME`` characters, or ``end`` where more, if it is longer); at ``end``
    0, ``…/model.safetensors``."""
    if len(path) > 1 and path.endswith("/"):  # a folder: its last name, then the slash
        return _path_ends(path.rstrip("/"), end) + "/"
    parts = path.split("/")
    if end == 0:  # the last step: the last name alone
        return "…/" + _tail(parts[-1], end)
    first = next((i for i, name in enumerate(parts) if name not in _ROOTS), len(parts) - 1)
    head, names = parts[:first + 1], parts[first + 1:]
    if not names:  # one name: the file's, whose end says most
        return "/".join([*head[:-1], _tail(head[-1], end)])
    if len(head[-1]) > end:
        head[-1] = head[-1][:end] + "…"
    tail = [_tail(names.pop(), end)]
    while names and names[-1] != "…" and len("/".join([names[-1], *tail])) <= end:
        tail.insert(0, names.pop())
    return "/".join([*head, *(["…"] if names else []), *tail])


def _tail(name: str, end: int) -> str:
    keep = max(end, _NAME)
    return name if len(name) <= keep else "…" + name[-keep:]
