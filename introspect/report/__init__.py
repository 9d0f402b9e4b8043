"""Reports of a diff: JSON, CSV, Markdown, HTML, JUnit XML and the error-coloured drawing.

Each writer module turns a ``DiffResult`` into text (or bytes) and touches no file;
``write_reports`` renders them all in memory first, then swaps the whole set into the
folder at once (``files.write_folder``), so the folder never holds a mix of two runs.

Example::

    >>> result = introspect.diff(hf_model, port, inputs)
    >>> paths = write_reports(result, "parity-report")
    >>> sorted(p.name for p in paths)
    ['diff.html', 'diff.json', 'diff.md', 'diff.svg', 'junit.xml', 'layers.csv', 'nodes.csv']
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from introspect.files import check_writable_folder, write_folder
from introspect.report.csv_report import layers_csv, nodes_csv
from introspect.report.html_report import html_report
from introspect.report.json_report import SCHEMA_VERSION, json_report
from introspect.report.junit import junit_xml
from introspect.report.markdown import markdown_summary
from introspect.report.overlay import overlay_svg

if TYPE_CHECKING:
    from introspect.diff.result import DiffResult

__all__ = ["SCHEMA_VERSION", "html_report", "json_report", "junit_xml", "layers_csv",
           "markdown_summary", "nodes_csv", "overlay_svg", "render_reports", "write_reports"]


# Every file a report set may hold; write_folder replaces them as one set.
REPORT_FILES = ("diff.json", "nodes.csv", "layers.csv", "diff.md", "junit.xml", "diff.html",
                "diff.svg", "heads.csv", "heads.svg")


def render_reports(result: DiffResult, *, drawing: bool = True) -> dict[str, str | bytes]:
    """Every report as file name -> content; the drawing is left out when it cannot be made."""
    svg = overlay_svg(result) if drawing else None
    reports: dict[str, str | bytes] = {
        "diff.json": json_report(result),
        "nodes.csv": nodes_csv(result),
        "layers.csv": layers_csv(result),
        "diff.md": markdown_summary(result),
        "junit.xml": junit_xml(result),
        "diff.html": html_report(result, svg=svg),
    }
    if svg is not None:
        reports["diff.svg"] = svg
    return reports


def write_reports(result: DiffResult, folder: str | os.PathLike[str], *,
                  drawing: bool = True, extra: Mapping[str, str | bytes] | None = None
                  ) -> list[Path]:
    """Write every report into ``folder`` (created if its parent exists); return the paths.

    ``extra`` adds files of ``REPORT_FILES``' other names (the attention heads' table and
    drawing) to the same all-or-nothing set.

    Raises:
        InputError: the folder cannot be created or written.
    """
    check_writable_folder(folder, REPORT_FILES)
    reports = render_reports(result, drawing=drawing) | dict(extra or {})  # all in memory first
    # the whole set or, on any failure, the previous one; an old diff.svg does not linger
    return write_folder(folder, reports, owned=REPORT_FILES)
