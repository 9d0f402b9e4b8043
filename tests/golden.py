"""Golden files: compare text with the checked-in copy, or rewrite it on request.

Run with ``INTROSPECT_UPDATE_GOLDEN=1`` to rewrite the golden files, then review the diff.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

# A number as the reports print it: an integer, a decimal, or one in scientific notation.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# Two printed floats agree to this share (a last digit of three flipped: up to 1%) ...
_RELATIVE = 0.01
# ... or are both below it: the float32 budget's atol, under which a value is rounding
# noise, its digits those of the CPU's kernels (a hypothesis's residual, 8.3e-07 on an AMD
# Zen 5 where an Intel Xeon printed 9.5e-07)
_NOISE = 1e-5


def check_golden(path: Path, text: str) -> None:
    """Assert that ``text`` is the golden file at ``path`` (rewritten on request), but for
    the last digits of floats (``same_but_rounding``)."""
    if os.environ.get("INTROSPECT_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with INTROSPECT_UPDATE_GOLDEN=1"
    assert same_but_rounding(path.read_text(encoding="utf-8"), text), (
        f"{path.name} differs from its golden file (beyond the last digits of floats, which "
        "follow the CPU's kernels); if the change is intended, rewrite it with "
        "INTROSPECT_UPDATE_GOLDEN=1 and review the diff")


def same_but_rounding(expected: str, actual: str) -> bool:
    """``expected`` and ``actual`` alike but for the digits rounding puts in floats: the
    same text between the numbers, every integer the same, and every float within
    ``_RELATIVE`` of the other, or both under ``_NOISE``. Goldens written on one CPU and
    read on another differ there (their kernels sum in another order), and nowhere else:
    a word, a status, a count or a shape that moved still fails."""
    if expected == actual:
        return True
    if _NUMBER.split(expected) != _NUMBER.split(actual):
        return False
    for a, b in zip(_NUMBER.findall(expected), _NUMBER.findall(actual), strict=True):
        if a == b:
            continue
        if not any(c in a + b for c in ".eE"):
            return False  # an integer moved
        x, y = float(a), float(b)
        if not (math.isclose(x, y, rel_tol=_RELATIVE) or max(abs(x), abs(y)) < _NOISE):
            return False
    return True
