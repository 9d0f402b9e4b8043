"""Reports of a diff: JSON, CSV, Markdown, HTML, JUnit XML and the error-coloured drawing.

Each writer module turns a ``DiffResult`` into text (or bytes) and touches no file;
``write_reports`` renders them all in memory first, then writes each file atomically
(temp file, then rename), so an interrupted run never leaves a half-written report.

Example::

    >>> result = introspect.diff(hf_model, port, inputs)
    >>> paths = write_reports(result, "parity-report")
    >>> sorted(p.name for p in paths)
    ['diff.html', 'diff.json', 'diff.md', 'diff.svg', 'junit.xml', 'layers.csv', 'nodes.csv']
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from introspect.files import check_writable_folder, write_atomic
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
                  drawing: bool = True) -> list[Path]:
    """Write every report into ``folder`` (created if its parent exists); return the paths.

    Raises:
        InputError: the folder cannot be created or written.
    """
    target = check_writable_folder(folder)
    reports = render_reports(result, drawing=drawing)  # all rendered before any is written
    target.mkdir(exist_ok=True)
    return [write_atomic(target / name, content) for name, content in reports.items()]
