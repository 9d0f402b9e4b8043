"""Attention heads concatenated in another order are named (probe round t, port 11: a port
whose layer 3 concatenated its heads last to first was placed at its ``cat`` with no hint).
``hypotheses.head_order`` reads which reference head each of the candidate's head blocks
holds, and judges the reference's context so reordered like any hypothesis. A port
concatenating its heads in order passes."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import diff_port


def test_heads_in_their_order_pass(mini):
    result = diff_port(mini, "head_order.py", "correct")
    assert result.passed, result.summary()


@pytest.mark.parametrize("build, said", [
    ("reversed_heads", "(reversed)"),
    ("swapped_heads", "(head 0 holds the reference's head 5, head 5 holds the reference's head 0)"),
])
def test_heads_in_another_order_are_named(mini, build, said):
    result = diff_port(mini, "head_order.py", build)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.3"
    assert divergence.module.startswith("encoder.layer.3.attention"), divergence
    named = [h for h in divergence.hints if "heads in another order" in h]
    assert len(named) == 1 and said in named[0], divergence.hints
