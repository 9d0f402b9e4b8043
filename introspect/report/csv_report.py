"""The diff's two tables as CSV: one row per node (``nodes.csv``) and per layer (``layers.csv``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from introspect.csv_cells import csv_text

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult


def nodes_csv(result: DiffResult) -> str:
    """``DiffResult.nodes`` as CSV (aligned pairs and unmatched nodes, in graph order)."""
    return csv_text(result.nodes)


def layers_csv(result: DiffResult) -> str:
    """``DiffResult.layers`` as CSV."""
    return csv_text(result.layers)
