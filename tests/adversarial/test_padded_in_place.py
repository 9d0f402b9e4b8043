"""A port whose output is a buffer of zeros it fills in place, row by row
(``ports/padded_in_place.py``, probe round p): its output was paired with the node that
made the buffer, whose recorded value is all zeros, and a correct port FAILED."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_an_output_filled_in_place_is_compared_as_returned(build, code):
    done = run_port("padded_in_place.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "'last_hidden_state' is written in place after new_zeros made it" in done.stdout, \
        done.stdout
    assert "-> new_zeros" not in done.stdout, done.stdout  # (never paired with the buffer)
