"""A port whose FFN output Linear is split in two halves of its inputs, summed
(``ports/split_ffn_out.py``, probe round q): the first half takes the first features
of the GELU's output, and no longer stands for the whole Linear by its value; its
faulty twin FAILS in its own LayerNorm, on the real CLI, with no "left unloaded" hint."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import first_divergence, run_port


@pytest.mark.parametrize("build, code", [("correct", 0), ("faulty", 1)])
def test_a_linear_split_in_halves_of_its_inputs_is_not_held_to_the_whole(build, code):
    done = run_port("split_ffn_out.py", build)
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    assert "out_a" not in first_divergence(done.stdout), done.stdout
    assert "left unloaded" not in done.stdout, done.stdout
    if build == "faulty":
        assert "encoder.layer.3.output.LayerNorm" in first_divergence(done.stdout), \
            done.stdout
