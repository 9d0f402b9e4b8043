"""A port running its batch rows in reverse order (``ports/reversed_rows.py``, probe
round p), or its sequence back to front (``ports/flipped_sequence.py``, round s): each
op-level pair compares the candidate's rows (tokens) with the reference's in the order
they line up, and a correct port no longer FAILS; its faulty twin FAILS in its layer, on
the real CLI."""

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
def test_a_sequence_back_to_front_is_compared_token_for_token(build, code):
    """The correct port FAILED at its position ids, word embeddings and every attention
    (each by about 1); the heads, each on the reference's inputs to its layer in the
    candidate's token order, said layer 0 differed."""
    done = run_port("flipped_sequence.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":  # (the heads are compared where the verdict fails)
        assert "heads within budget" in done.stdout, done.stdout
        divergence = first_divergence(done.stdout)
        assert "encoder.layer.3.intermediate" in divergence, done.stdout


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
