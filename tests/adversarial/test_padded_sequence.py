"""A port padding its sequence to a multiple of 8 (``ports/pad_to_eight.py``, probe round
q): where the whole models' float64 runs part reads each value over the longer sequence
by its first positions, and a layer stood for by no near value names nothing; its faulty
twin is named in its layer, not the embeddings, on the real CLI."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_port_over_a_padded_sequence_is_named_in_its_layer(build, code):
    done = run_port("pad_to_eight.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":
        divergence = first_divergence(done.stdout)
        assert divergence.startswith("first divergence: encoder.layer.3 "), done.stdout
