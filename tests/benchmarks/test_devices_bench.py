"""Smoke run of the device-split benchmark (``benchmarks/devices_bench.py``) on bert-tiny.

Nothing here asserts a time: it proves the row still runs end to end and carries its
figures, with ``cpu`` standing in for the candidate's device.
"""

from __future__ import annotations

import pytest

from benchmarks.devices_bench import split

pytestmark = pytest.mark.bench


def test_the_cpu_stand_in_row_runs_and_carries_its_figures():
    row = split("bert-tiny", "cpu", repeat=1, batch=2, seq=9)
    assert row["passed"] is True
    assert row["candidate"] == "bfloat16 on cpu" and row["reference"] == "float32 on cpu"
    assert row["diff_s"] > 0 and row["two_forwards_s"] > 0
    assert row["ratio"] == pytest.approx(row["diff_s"] / row["two_forwards_s"], rel=0.05)
    assert 0 < row["max_abs_err"] < 0.1  # bf16 really ran, and agreed
    assert row["gpu_peak_mib"] is None
