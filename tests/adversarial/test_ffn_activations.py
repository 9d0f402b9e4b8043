"""Another activation where GELU belongs is named (probe round t, port 5: a QuickGELU in
layer 3 was placed at the activation with no hint; tests/diff/test_torch_builtin_port.py's
ReLU fault was an expected miss). ``hypotheses.activation`` re-runs the layer with ReLU,
SiLU and QuickGELU for its GELU; the one that reproduces the candidate's values is named,
and only that one. A port writing GELU out by hand passes."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import diff_port

NAMES = {"relu": "ReLU", "silu": "SiLU", "quick": "QuickGELU"}


def test_gelu_written_out_passes(mini):
    result = diff_port(mini, "ffn_activations.py", "correct")
    assert result.passed, result.summary()


@pytest.mark.parametrize("build", sorted(NAMES))
def test_another_activation_is_named(mini, build):
    result = diff_port(mini, "ffn_activations.py", build)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.3"
    assert divergence.module.startswith("encoder.layer.3.intermediate"), divergence
    named = [h for h in divergence.hints if "FFN activation is" in h]
    assert len(named) == 1, divergence.hints
    assert named[0].startswith(f"the candidate's FFN activation is {NAMES[build]}")
