"""Batch rows through the encoder in two threads at once (``ports/thread_rows.py``, probe
round o): the recording interleaves the two threads' module calls, and its replay failed.
A correct port got exit 2 and a traceback; it gets its verdict now, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1), ("faulty_small", 1)])
def test_rows_in_two_threads_get_a_verdict_without_a_traceback(build, code):
    done = run_port("thread_rows.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty_small":  # under the outputs' budget: found where it was handed on
        assert "hands on blocks.1 (args.0): it took what blocks.0 returned" in done.stdout, \
            done.stdout
        assert "first divergence: encoder.layer.1 " in done.stdout, done.stdout


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_rows_spread_over_threads_in_each_layer_name_no_layer_falsely(build, code):
    """``ports/thread_layer_rows.py`` (probe round p): the faulty row computes layer 3 by
    hand, so no module call stands for it; the FAIL named layer 0's query, claiming none
    of its weights relates to the reference's, from calls numbered in thread order."""
    done = run_port("thread_layer_rows.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "relates to the reference's" not in done.stdout, done.stdout
    divergence = first_divergence(done.stdout)
    assert ("first divergence" in divergence) == (build == "faulty"), done.stdout
    for elsewhere in ("encoder.layer.0", "encoder.layer.1", "encoder.layer.2", "blocks.0",
                      "blocks.1", "blocks.2"):
        assert elsewhere not in divergence, divergence
