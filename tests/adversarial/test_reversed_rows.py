"""A port running its batch rows in reverse order (``ports/reversed_rows.py``, probe
round p): each op-level pair compares the candidate's rows with the reference's in the
order they line up, and a correct port no longer FAILS; its faulty twin FAILS in its
layer, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_rows_in_another_order_are_compared_row_for_row(build, code):
    done = run_port("reversed_rows.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":
        divergence = first_divergence(done.stdout)
        assert "encoder.layer.3.output.LayerNorm" in divergence, done.stdout


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_rows_sorted_by_length_take_the_order_other_values_proved(build, code):
    """``ports/sorted_rows.py``: rows alike in one value (two rows' token types) take the
    order the word embeddings proved; the heads are compared in that order too."""
    pairs = [option for first, second in SORTED_TEXT_PAIRS
             for option in ("--text-pair", first, second)]
    done = run_port("sorted_rows.py", build, *pairs)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":  # (the heads are compared where the verdict fails)
        assert "heads within budget" in done.stdout, done.stdout
        assert "encoder.layer.3.output.LayerNorm" in first_divergence(done.stdout), \
            done.stdout


SORTED_TEXT_PAIRS = (("a b c", "d e"), ("the cat sat", "on the mat"), ("x", "y z w"))
