"""A value bias folded into the output projection's bias (``ports/folded_value_bias.py``,
probe round s), on the real CLI: the fold is proven by value (``modules/folds.py``), so
the value Linear is compared as the reference's less its bias and a float64 run takes the
folded bias's exact sum; a fold rounded through float16 is no fold, and fails in its layer."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [
    ("correct", 0), ("correct_keyless", 0), ("faulty", 1), ("faulty_keyless", 1)])
def test_a_folded_value_bias_passes_and_a_rounded_one_fails_in_its_layer(build, code):
    done = run_port("folded_value_bias.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if code:
        assert "encoder.layer.3" in first_divergence(done.stdout), done.stdout
