"""Zero biases under ``--backward`` (``fused_kqv_port.py``, probe round q): a bias of one
value throughout is placed by the weight beside it, in a fused projection and in an FFN
whose hidden units run in another order; correct ports pass, a faulty one fails, on the
real CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import launch

PORT = Path(__file__).with_name("fused_kqv_port.py")


@pytest.mark.parametrize("build, code", [("build", 0), ("permuted_ffn", 0), ("faulty", 1)])
def test_zero_biases_take_their_rows_from_their_weights(build, code):
    done = launch.run(
        [sys.executable, "-m", "introspect", "diff", "--candidate", f"{PORT}:{build}",
         "--model", "bert-tiny", "--head", "masked-lm", "--backward"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    failing = [line for line in done.stdout.splitlines()
               if line.startswith("FAIL ") and ".bias" in line]
    assert failing == [], done.stdout  # no bias's gradient read from another's rows
    if build == "faulty":
        assert "first divergence: " in done.stdout and "layer.1" in done.stdout, done.stdout


def test_a_fault_on_permuted_features_is_measured_in_their_order():
    """``permuted_ffn_faulty``: the tanh GELU runs on the FFN's permuted hidden units; the
    GELU's pair is compared in the order of the weight before it, and its local error is
    the fault's (about 1e-4), not the permutation's (0.77)."""
    done = launch.run(
        [sys.executable, "-m", "introspect", "diff", "--candidate",
         f"{PORT}:permuted_ffn_faulty", "--model", "bert-tiny", "--head", "masked-lm",
         "--json", "-", "--quiet"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    first = json.loads(done.stdout)["first_divergence"]
    assert first["layer"] == "encoder.layer.1", first
    assert first["local_max_abs_err"] < 1e-3, first
