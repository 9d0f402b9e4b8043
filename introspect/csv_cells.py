"""Tables as CSV that a spreadsheet opens as data, never as formulas. Imports nothing
internal: the graph's exports and the diff's reports both write through it."""

from __future__ import annotations

import re
from typing import Any

_FORMULA = re.compile(r"[=+@\t\r]|-(?![\d.]*(?:e[-+]?\d+)?$)")


def csv_text(frame: Any) -> str:
    """A pandas table as CSV that a spreadsheet opens as data, never as formulas.

    Module and node names come from user code (a port's ``=HYPERLINK(...)`` or
    ``=cmd|...`` attribute name): a text cell that a spreadsheet would evaluate (it starts
    with ``=``, ``+``, ``@``, a tab, a carriage return, or a ``-`` that is not a number)
    gets a leading ``'``, as OWASP advises. Numbers are written as they are.
    """
    def safe(value: Any) -> Any:
        return f"'{value}" if isinstance(value, str) and _FORMULA.match(value) else value

    text_columns = list(frame.select_dtypes(exclude=["number", "bool"]).columns)
    if text_columns:
        frame = frame.copy()
        for column in text_columns:
            frame[column] = frame[column].map(safe)
    return str(frame.to_csv(index=False, lineterminator="\n"))


__all__ = ["csv_text"]
