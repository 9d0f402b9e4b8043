"""The notebooks' tests: run one top to bottom, check the stored one, read its outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def executed(path: Path, folder: Path) -> Any:
    """The notebook at ``path`` run top to bottom offline, with ``folder`` as its cwd."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    return notebook


def stored_with_outputs(path: Path) -> Any:
    """The notebook as stored; every code cell has outputs and none is an error."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs for cell in code)
    assert not any(o.output_type == "error" for cell in code for o in cell.outputs)
    return notebook


def cell_text(cell: Any, *, html: bool = False) -> str:
    """What a code cell printed and returned, as plain text (and as HTML on request)."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output:
            parts.append(output.data.get("text/plain", ""))
            if html:
                parts.append(output.data.get("text/html", ""))
    return "\n".join(parts)


def output_text(notebook: Any, *, html: bool = False) -> str:
    """What every code cell printed and returned (``cell_text``)."""
    return "\n".join(cell_text(cell, html=html) for cell in notebook.cells
                     if cell.cell_type == "code")
