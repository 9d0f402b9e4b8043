"""A float64 port's fault is hinted by what reproduces it, not by rounding
(``ports/float64_norm.py``, probe round s): the dtype hint is the explanation of last
resort, dropped beside a hypothesis that reproduces the candidate's values."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_float64_norm_fault_is_not_hinted_as_rounding(build, code):
    done = run_port("float64_norm.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if code:
        assert "encoder.layer.3.attention.output.LayerNorm" in first_divergence(done.stdout), \
            done.stdout
        assert "unbiased variance" in done.stdout, done.stdout
        assert "rounding alone" not in done.stdout, done.stdout
