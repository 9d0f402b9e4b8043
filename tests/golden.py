"""Golden files: compare text with the checked-in copy, or rewrite it on request.

Run with ``INTROSPECT_UPDATE_GOLDEN=1`` to rewrite the golden files, then review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(path: Path, text: str) -> None:
    """Assert that ``text`` equals the golden file at ``path`` (rewritten on request)."""
    if os.environ.get("INTROSPECT_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with INTROSPECT_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} differs from its golden file; if the change is intended, rewrite it "
        "with INTROSPECT_UPDATE_GOLDEN=1 and review the diff")
