"""A port holding one Linear per head (``ports/per_head_linears.py``, probe round r):
under ``--backward`` each reference weight held in row blocks by several weights has its
gradient put together and compared; a fault scaling one head's query-weight gradient by
1.01 (its forward unchanged) FAILS, named at that weight, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty_gradient", 1)])
def test_weights_held_per_head_have_their_gradients_compared(build, code):
    done = run_port("per_head_linears.py", build, "--backward")
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "gradient parity" in done.stdout, done.stdout
    assert " 103 parameters" in done.stdout, done.stdout  # (67 before: 36 left out)
    if build == "faulty_gradient":
        assert "first backward divergence: parameter " \
            "encoder.layer.3.attention.self.query.weight (in encoder.layer.3; the " \
            "candidate's blocks.3.hq.1)" in done.stdout, done.stdout


def test_weights_held_per_head_are_not_said_unloaded():
    done = run_port("per_head_linears.py", "faulty_scale")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "encoder.layer.3" in first_divergence(done.stdout), done.stdout
    assert "left unloaded" not in done.stdout, done.stdout
