"""A port padding its sequence to a multiple of 8 (``ports/pad_to_eight.py``, probe round
q): where the whole models' float64 runs part reads each value over the longer sequence
by its first positions, and a layer stood for by no near value names nothing; a pair
after blocks of which nothing was paired is named where those runs part. Its faulty
twins are named in their layer, not the embeddings or the last layer, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1), ("faulty_gelu", 1)])
def test_a_port_over_a_padded_sequence_is_named_in_its_layer(build, code):
    done = run_port("pad_to_eight.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build != "correct":
        divergence = first_divergence(done.stdout)
        assert "in encoder.layer.3" in divergence, done.stdout
        assert "embeddings" not in divergence and "encoder.layer.5" not in divergence, \
            done.stdout
