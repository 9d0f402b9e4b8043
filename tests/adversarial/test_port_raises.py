"""A port whose forward raises on the diff's inputs (``ports/stale_mask.py``, probe round
r): exit 2, one line naming the port's build, no traceback."""

from __future__ import annotations

from tests.adversarial.corpus import run_port


def test_a_port_that_raises_is_named_by_its_build():
    done = run_port("stale_mask.py", "build")
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, done.stderr
    assert "stale_mask.py:build (CachedMask) could not run" in errors[0], errors
