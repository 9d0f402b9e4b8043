"""Weights made by a registered parametrization (``ports/parametrized_weights.py``, probe
round s): a verdict on the real CLI, never an internal error. The heads, which torch.fx
traces, are left out where that trace cannot run (a weight computed from its fake
values)."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_parametrized_weights_get_a_verdict(build, code):
    done = run_port("parametrized_weights.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "internal error" not in done.stderr, done.stderr
    if build == "faulty":
        assert "encoder.layer.3.attention.output.LayerNorm" in first_divergence(done.stdout), \
            done.stdout
