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


def test_a_fault_the_recording_does_not_see_is_named_in_its_layer():
    """``faulty_numpy``: a NumPy norm with eps 1e-5 in layer 3, under the outputs' budget;
    where the two runs part is found with the candidate's tokens in the reference's order
    (the whole models' float64 check named the embeddings)."""
    done = run_port("flipped_sequence.py", "faulty_numpy")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "encoder.layer.3" in first_divergence(done.stdout), done.stdout


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


@pytest.mark.parametrize("file, build, code", [
    ("reversed_rows.py", "correct", 0), ("flipped_sequence.py", "correct", 0),
    ("flipped_sequence.py", "faulty", 1)])
def test_gradients_are_compared_in_the_order_the_forward_found(file, build, code):
    """Under ``--backward`` each node gradient is put in the reference's order of rows or
    tokens, as its forward value was (``Pair.axis_order``): both correct ports FAILED in
    the backward at layer 5's GELU (by 0.11), whose forward passed."""
    done = run_port(file, build, "--backward")
    assert done.returncode == code, done.stdout + done.stderr[-2000:]
    if build == "faulty":
        backward = next(line for line in done.stdout.splitlines()
                        if line.startswith("first backward divergence:"))
        assert "encoder.layer.3.intermediate" in backward, done.stdout


def test_a_repro_compares_in_the_order_the_diff_found(tmp_path):
    """``--repro`` on the faulty back-to-front port: its ``compare`` puts the candidate's
    tokens back in the reference's order, so the script measures what the diff did
    (it measured 13.9 where the diff said 4.7e-4)."""
    import re
    import subprocess
    import sys

    done = run_port("flipped_sequence.py", "faulty", "--repro", str(tmp_path / "repro"))
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    ran = subprocess.run([sys.executable, str(tmp_path / "repro" / "repro.py")],
                         capture_output=True, text=True, timeout=120)
    found = re.search(r"max abs difference (\S+) \(introspect measured (\S+)\)", ran.stdout)
    assert found is not None and found[1] == found[2], ran.stdout + ran.stderr
    assert "tokens come in another order" in (tmp_path / "repro" / "repro.py").read_text()


def test_heads_in_another_order_are_compared_with_those_they_match():
    """``ports/permuted_heads.py``: the faulty twin's heads are each compared with the
    reference head they match (they were compared at their own index: 62 of 72 over)."""
    done = run_port("permuted_heads.py", "faulty")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "encoder.layer.3.intermediate" in first_divergence(done.stdout), done.stdout
    heads = next(line for line in done.stdout.splitlines() if line.startswith("attention heads"))
    assert "in another order" in heads and "heads within budget" in heads, done.stdout
