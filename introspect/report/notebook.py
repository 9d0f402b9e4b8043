"""A diff in a notebook: tables that highlight their failing rows, and stay DataFrames.

``DiffResult.nodes`` and ``.layers`` return a ``DiffTable``: a ``pandas.DataFrame``
subclass whose only change is how Jupyter shows it (``_repr_html_`` through a pandas
Styler: failing rows red, drifting rows yellow, unmatched rows grey). Why a subclass and
not a Styler: a Styler is not a DataFrame (``result.nodes[result.nodes.status == "fail"]``
would fail on it), while a subclass filters, sorts and exports as any DataFrame, and what
a filter returns is a ``DiffTable`` again, so it is still highlighted.

Example::

    >>> failing = result.nodes[result.nodes.status == "fail"]   # a DiffTable
    >>> failing[["reference_node", "local_max_abs_err"]]         # shows highlighted
    >>> result.draw(depth=2)                                     # the drawing, by error
"""

from __future__ import annotations

import hashlib
from typing import Any

import pandas as pd

# Row backgrounds: the same colours as diff.html.
ROW_STYLES = {"fail": "background-color:#f8d7da", "drift": "background-color:#fff3cd",
              "unmatched": "color:#777", "skipped": "color:#777",
              "FAIL": "background-color:#f8d7da", "n/a": "color:#777"}  # layers: status words


class DiffTable(pd.DataFrame):
    """A DataFrame of a diff (nodes or layers) that shows its failing rows highlighted."""

    @property
    def _constructor(self) -> type[DiffTable]:
        return DiffTable  # filtered, sorted or copied tables stay highlighted

    def _repr_html_(self) -> str | None:
        limit = pd.get_option("display.max_rows") or len(self)
        shown = self if len(self) <= limit else self.head(limit)
        try:
            page = styled(shown).to_html()
        except ImportError:  # pandas' Styler needs jinja2
            return super()._repr_html_()  # type: ignore[no-any-return]
        if len(shown) < len(self):
            page += (f"<p>… and {len(self) - len(shown)} more rows of {len(self)}; filter the "
                     "table (e.g. <code>df[df.status == 'fail']</code>) or raise "
                     "<code>pd.options.display.max_rows</code></p>")
        return page


def highlighted(frame: pd.DataFrame) -> DiffTable:
    """``frame`` as a ``DiffTable`` (same data, same columns)."""
    return DiffTable(frame)


def styled(frame: pd.DataFrame) -> Any:
    """A pandas Styler: rows coloured by ``status`` (nodes) or ``passed`` (layers)."""
    floats = [c for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]
    # A uuid from the content, not a random one: the same table gives the same HTML.
    uuid = hashlib.sha1(frame.to_csv().encode("utf-8")).hexdigest()[:10]
    return (pd.DataFrame(frame).style.set_uuid(uuid)
            .apply(lambda row: [_row_style(row)] * len(row), axis=1)
            .format("{:.3g}", subset=floats, na_rep="")
            .format(na_rep="", subset=[c for c in frame.columns if c not in floats])
            .hide(axis="index"))


def _row_style(row: pd.Series) -> str:
    if "status" in row.index:
        return ROW_STYLES.get(str(row["status"]), "")
    if "passed" in row.index and row["passed"] is not None and not bool(row["passed"]):
        return ROW_STYLES["fail"]
    return ""

