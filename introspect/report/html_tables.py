"""HTML tables for the reports: escaped cells, numbers with their raw value for sorting.

A row carries its status as a class (``fail``, ``drift``, ...), which the stylesheet
colours and the filter reads.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """One table cell: its escaped HTML, and the value it sorts by (numbers only)."""

    html: str
    sort_value: str | None = None  # data-v: a number as text, "" for no value
    numeric: bool = False


def text_cell(text: str, *, code: bool = False) -> Cell:
    escaped = html.escape(text)
    return Cell(f"<code>{escaped}</code>" if code and text else escaped)


def number_cell(value: float | int | None) -> Cell:
    """Three significant digits shown; the exact value kept in ``data-v`` for sorting."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Cell("", "", numeric=True)
    shown = f"{value:.3g}" if isinstance(value, float) else str(value)
    return Cell(shown, repr(float(value)), numeric=True)


def na_cell() -> Cell:
    """A number that does not exist (nothing compared): "n/a", sorted below every value."""
    return Cell("n/a", "", numeric=True)


def table(table_id: str, headers: Sequence[str], rows: Sequence[tuple[str, Sequence[Cell]]],
          *, hide_unless: str | None = None) -> str:
    """A sortable table; rows are (status class, cells).

    ``hide_unless``: rows of any other status start hidden (the filter's checkbox shows
    them), so a long table opens on what matters.
    """
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for status, cells in rows:
        tds = "".join(
            f"<td class='num' data-v='{c.sort_value}'>{c.html}</td>" if c.numeric
            else f"<td>{c.html}</td>" for c in cells)
        hidden = " style='display:none'" if hide_unless and status != hide_unless else ""
        body.append(f"<tr class='{html.escape(status)}'{hidden}>{tds}</tr>")
    return (f"<div class='table-wrap'><table id='{table_id}' class='introspect-diff sortable'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>")
