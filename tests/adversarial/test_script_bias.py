"""A port adding its FFN's first bias inside a TorchScript helper
(``ports/script_bias_gelu.py``, probe round r): the Linear's product, handed where the
recording does not reach, is compared less the bias it never saw read; a correct port
passes, and its faulty twin is named in its layer, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_bias_added_in_a_scripted_helper_is_not_counted_missing(build, code):
    done = run_port("script_bias_gelu.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":
        assert "encoder.layer.3" in first_divergence(done.stdout), done.stdout
        for other in ("encoder.layer.0", "encoder.layer.1", "encoder.layer.2"):
            assert other not in first_divergence(done.stdout), done.stdout
