"""A bias held but never added is named (probe round t, port 8: an FFN of ``torch.addmm``
whose layer-3 output projection ran as ``torch.mm`` was placed at
``encoder.layer.3.output.dense`` with no hint). ``hypotheses.weights`` re-runs the layer
with each non-zero bias left out; where that reproduces the candidate's value, the hint
names the bias. A port holding every bias passes; one leaving a Linear's or a LayerNorm's
bias out of layer 3 fails there, with that bias, and only that one, named."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import diff_port, first_divergence, run_port

HINT = "bias encoder.layer.3.{} is not added in the candidate"


def test_a_port_adding_every_bias_passes(mini):
    result = diff_port(mini, "bias_not_added.py", "correct")
    assert result.passed, result.summary()


@pytest.mark.parametrize("build, bias", [
    ("ffn_bias_not_added", "output.dense.bias"),
    ("attention_bias_not_added", "attention.output.dense.bias"),
    ("norm_bias_not_added", "output.LayerNorm.bias"),
])
def test_a_bias_left_out_is_named(mini, build, bias):
    result = diff_port(mini, "bias_not_added.py", build)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.3"
    assert divergence.module == f"encoder.layer.3.{bias.removesuffix('.bias')}"
    named = [h for h in divergence.hints if "is not added" in h]
    assert named and named[0].startswith(HINT.format(bias)), divergence.hints
    assert len(named) == 1, divergence.hints  # the one left out, no other bias


def test_the_cli_prints_the_hint():
    done = run_port("bias_not_added.py", "ffn_bias_not_added")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "encoder.layer.3" in first_divergence(done.stdout)
    assert f"hint: {HINT.format('output.dense.bias')}" in done.stdout
