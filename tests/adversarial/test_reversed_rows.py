"""A port running its batch rows in reverse order (``ports/reversed_rows.py``, probe
round p): each op-level pair compares the candidate's rows with the reference's in the
order they line up, and a correct port no longer FAILS; its faulty twin FAILS in its
layer, on the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.adversarial.corpus import PORTS


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_rows_in_another_order_are_compared_row_for_row(build, code):
    done = subprocess.run(
        [sys.executable, "-m", "introspect", "diff", "--candidate",
         f"{PORTS / 'reversed_rows.py'}:{build}"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    if build == "faulty":
        divergence = next(line for line in done.stdout.splitlines()
                          if line.startswith("first divergence:"))
        assert "encoder.layer.3.output.LayerNorm" in divergence, done.stdout
