"""A port calling one template block through ``torch.func.functional_call`` with each
layer's weights (``ports/template_call.py``, probe round r): its replay does not
reproduce its recording, so its node rows are unconfirmed and name nothing, and no heads
are traced from it; a correct port passes with no FAIL anywhere, and its faulty twin is
named in its layer, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_replay_that_differs_from_its_recording_decides_and_names_nothing(build, code):
    done = run_port("template_call.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL ")], done.stdout
    assert "attention heads" not in done.stdout, done.stdout
    if build == "correct":
        assert first_divergence(done.stdout) == "", done.stdout
    else:
        assert "in encoder.layer.3)" in first_divergence(done.stdout), done.stdout
