"""A boolean attention mask the recording keeps as a constant is no weight
(``ports/sdpa_bool_mask.py``, probe round s): the faulty twin's FAIL names its scale,
and no hint calls the mask a weight left unloaded."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_bool_mask_is_no_weight(build, code):
    done = run_port("sdpa_bool_mask.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if code:
        assert "encoder.layer.3.attention" in first_divergence(done.stdout), done.stdout
        assert "attention scale differs" in done.stdout, done.stdout
        assert "_tensor_constant" not in done.stdout, done.stdout
