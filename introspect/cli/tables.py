"""Terminal tables and prose that fit the terminal: rich at the console's width.

Long cells are cut with an ellipsis at a word boundary only (after ``_``, ``.``, a space,
or between ``GELU`` and ``Activation``): at the start for node names next to their
layer (``…output_layer_norm``), in the middle for labels, or folded onto more lines at
those boundaries (``cut="fold"``: ``attention_self_`` / ``query``). A name with no
boundary that fits is folded, never cut mid-word. Headers fold too. Number columns
(``width=0`` without ``flex``) take the width of their widest cell: a number is never cut.
FAIL is red on a terminal; a capped table ends with "… and N more". Prose (verdicts,
hints, notes) is wrapped at spaces with a hanging indent (``prose``); a word longer than
the line (a path, a node name) stays whole. Piped output is plain text (no colour, no
box characters), tables as wide as ``COLUMNS`` says (default 120), prose wrapped only
where ``COLUMNS`` is set.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

PIPE_WIDTH = 120  # piped output (CI logs, files): wide enough for names, still one line a row
MIN_WIDTH = 60

STATUS_STYLE = {"FAIL": "bold red", "fail": "bold red", "drift": "yellow", "pass": "green",
                "ok": "green", "unmatched": "dim", "skipped": "dim", "n/a": "dim"}


@dataclass(frozen=True)
class Column:
    """A table column: fixed width, or flexible (``flex`` > 0 shares the space left)."""

    header: str
    width: int = 0  # fixed width; 0: flexible (flex > 0) or as wide as its widest cell
    flex: int = 0  # share of the remaining width
    justify: str = "left"
    min_width: int = 8
    cut: str = "middle"  # a long cell: "middle" or "start" (cut there), or "fold" (lines)
    breaks: str = "_.,= "  # where a folded cell may break: after one of these characters
    optional: bool = False  # left out (the last first) where the others need the width


def console_for(stream: TextIO, width: int | None = None) -> Any:
    """A rich Console on ``stream``: the terminal's width and colour, or plain text in a pipe."""
    from rich.console import Console

    terminal = stream.isatty() and os.environ.get("TERM") != "dumb"
    # Prose wraps on a terminal and at a width asked for (COLUMNS, or the caller's); piped
    # with neither (a CI log, ``| tail -1``), each sentence stays one line.
    wrap_prose = terminal or width is not None or _columns_from_env() is not None
    if width is None:
        width = (shutil.get_terminal_size((PIPE_WIDTH, 24)).columns if terminal
                 else _columns_from_env() or PIPE_WIDTH)
    console = Console(file=stream, width=max(width, MIN_WIDTH), force_terminal=terminal,
                      color_system="auto" if terminal and not os.environ.get("NO_COLOR")
                      else None,
                      highlight=False, soft_wrap=False, emoji=False, legacy_windows=False)
    console.introspect_wrap_prose = wrap_prose  # type: ignore[attr-defined]  # read by prose
    return console


def table(columns: Sequence[Column], rows: Iterable[Sequence[str]], *, width: int,
          title: str | None = None, more: int = 0, more_hint: str = "") -> Any:
    """A rich Table whose flexible columns share ``width``; cells are cut, never wrapped.

    Args:
        columns: the columns, in order.
        rows: cell texts per row; a status column's text picks its colour.
        width: the console width the table must fit.
        title: a line above the table.
        more: rows left out; adds a last line "… and N more" (with ``more_hint``).
    """
    from rich import box
    from rich.table import Table
    from rich.text import Text

    rows = [row if isinstance(row, Heading) else list(row) for row in rows]
    columns, rows = _narrowed(columns, rows, width)
    widths = _fit(columns, [r for r in rows if not isinstance(r, Heading)], width)
    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                 collapse_padding=True, title=title, title_justify="left", title_style="bold",
                 header_style="bold", expand=False,
                 caption=f"… and {more} more{' ' + more_hint if more_hint else ''}"
                 if more else None, caption_justify="left", caption_style="none")
    for column, w in zip(columns, widths, strict=True):
        grid.add_column(fold(column.header, w, " /_"), justify=column.justify,  # type: ignore[arg-type]
                        no_wrap=True, overflow="ellipsis", width=w)
    for row in rows:
        if isinstance(row, Heading):
            grid.add_row(*(Text(fold(row.text, widths[i]) if i == row.column else "",
                                style="bold") for i in range(len(columns))))
            continue
        grid.add_row(*(Text(fold(text, w, c.breaks) if c.cut == "fold"
                            else shorten(text, w, c.cut, c.breaks),
                            style=STATUS_STYLE.get(text, ""))
                       for text, w, c in zip(row, widths, columns, strict=True)))
    return grid


class Heading(list[str]):
    """A row that names a group of the rows below it (a layer), in bold, in one column."""

    def __init__(self, text: str, column: int, size: int) -> None:
        super().__init__([text if i == column else "" for i in range(size)])
        self.text, self.column = text, column


def fold(text: str, width: int, breaks: str = "_.,= ") -> str:
    """``text`` on as many lines of at most ``width`` characters as it needs, broken after
    one of ``breaks`` where it can, anywhere where it cannot: nothing is lost (but the
    spaces and commas a break replaces)."""
    if len(text) <= width or width < 1:
        return text

    pieces = _pieces(text, breaks)
    lines: list[str] = []
    line = ""
    for piece in pieces:
        if len(line) + len(piece.rstrip()) <= width:
            line += piece
            continue
        if line:
            lines.append(line.rstrip())
        while len(piece.rstrip()) > width:
            lines.append(piece[:width])
            piece = piece[width:]
        line = piece.lstrip(" ,")
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def _pieces(text: str, breaks: str) -> list[str]:
    """``text`` split after each of ``breaks`` and between a lower and an upper case letter
    (``GELU`` | ``Activation``, ``Bert`` | ``Layer``): where a line may break."""
    import re

    pattern = f"(?<=[{re.escape(breaks)}])|(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])"
    return [p for p in re.split(pattern, text) if p]


def prose(console: Any, text: str, style: str = "", indent: int = 4) -> None:
    """Print ``text`` wrapped at the console's width, at spaces only: continuation lines
    indented by ``indent`` more than the first. A word longer than a line (a path, a node
    name) stays whole on its own line; nothing is cut. Piped output with no ``COLUMNS``
    is not wrapped: a script reading lines gets each sentence whole."""
    import textwrap

    from rich.text import Text

    if not getattr(console, "introspect_wrap_prose", True):  # piped, no width asked for:
        console.print(Text(text, style=style), soft_wrap=True)  # the last line stays whole
        return
    lead = len(text) - len(text.lstrip(" "))
    body = text.lstrip(" ")
    for phrase in KEEP_TOGETHER:  # a verdict is read (and searched for) as one phrase
        body = body.replace(phrase, phrase.replace(" ", "\xa0"))
    lines = textwrap.wrap(body, max(console.width - lead, 20),
                          subsequent_indent=" " * indent, break_long_words=False,
                          break_on_hyphens=False) or [""]
    for line in lines:
        console.print(Text(" " * lead + line.replace("\xa0", " "), style=style),
                      soft_wrap=True)


def wraps(console: Any, text: str) -> bool:
    """Whether ``prose`` prints ``text`` on more than one line."""
    return bool(getattr(console, "introspect_wrap_prose", True)) and len(text) > console.width


# Phrases prose never breaks: the verdicts and the words that open the last line.
KEEP_TOGETHER = ("gradient parity holds", "gradient parity FAILS", "parity holds",
                 "parity FAILS in the forward", "parity FAILS in the backward",
                 "parity FAILS at step", "parity FAILS", "first divergence:",
                 "first backward divergence:", "first divergent step:")


def emit(console: Any, renderable: Any) -> None:
    """Print on the console; in a pipe without the padding rich leaves at the ends of lines."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def shorten(text: str, width: int, cut: str = "middle", breaks: str = "_.,= /") -> str:
    """``text`` cut to ``width`` characters with an ellipsis, at word boundaries only.

    ``middle`` keeps whole words of the start (up to a third) and of the end; ``start``
    keeps the end only (for node names next to a layer column: the end says what the node
    does). Where no whole word of the end fits, ``text`` is folded onto lines instead.
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    pieces = _pieces(text, breaks)
    head = ""
    if cut != "start":
        for piece in pieces:
            if len(head) + len(piece) > (width - 1) // 3:
                break
            head += piece
    tail = ""
    for piece in reversed(pieces):
        if len(head) + 1 + len(tail) + len(piece) > width:
            break
        tail = piece + tail
    if not tail:
        return fold(text, width, breaks)
    return f"{head}…{tail}"


def _narrowed(columns: Sequence[Column], rows: list[Any], width: int,
              ) -> tuple[list[Column], list[Any]]:
    """The columns (and cells) that fit ``width`` at their narrowest: optional columns
    left out, the last first, until the others fit."""
    columns = list(columns)

    def narrowest(c: Column) -> int:
        return c.width or (c.min_width if c.flex else len(c.header))

    while sum(map(narrowest, columns)) + 2 * (len(columns) - 1) > width \
            and any(c.optional for c in columns):
        drop = max(i for i, c in enumerate(columns) if c.optional)
        del columns[drop]
        rows = [Heading(row.text, row.column - (row.column > drop), len(columns))
                if isinstance(row, Heading) else row[:drop] + row[drop + 1:] for row in rows]
    return columns, rows


def _fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Column widths that fit ``width`` (two spaces between columns).

    Fixed columns keep their width, columns of width 0 without flex that of their widest
    cell; flexible ones take what their longest cell needs, and when that is too much
    they share the space left by ``flex``, a column that needs less than its share giving
    the rest to the others.
    """
    natural = [max([len(c.header), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    widths = {i: c.width or natural[i] for i, c in enumerate(columns) if not c.flex}
    left = width - 2 * (len(columns) - 1) - sum(widths.values())
    open_ = {i: c for i, c in enumerate(columns) if c.flex}
    while open_:
        shares = sum(c.flex for c in open_.values())
        modest = {i for i, c in open_.items() if natural[i] <= left * c.flex // shares}
        if not modest:  # every one wants more than its share: cut them all to it
            for i, c in open_.items():
                widths[i] = max(c.min_width, left * c.flex // shares)
            over = sum(widths[i] for i in open_) - left  # minimum widths can overshoot
            while over > 0:  # a column above its minimum gives first, then the widest
                spare = max(open_, key=lambda i: (widths[i] - open_[i].min_width, widths[i]))
                if widths[spare] <= 1:
                    break
                widths[spare] -= 1
                over -= 1
            break
        for i in modest:
            widths[i] = natural[i]
            left -= natural[i]
            del open_[i]
    return [widths[i] for i in range(len(columns))]


def _columns_from_env() -> int | None:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        return None
