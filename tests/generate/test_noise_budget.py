"""``generate`` with ``noise_budget``: a port decoding in bfloat16 against the float32
reference. Without it, rounding alone fails every step, and ``--generate`` refused
``--noise-budget`` (probe round m: such a port had no passing path). With it, the
reference cast to the candidate's dtype decodes beside it, with its own cache, on the same
tokens, and each step's logits, cached tensors and nodes are held to at least 4x how far
that copy's are from the reference's (the prefill's nodes: the forward's own noise
budget, the reference in float64).

The port is ``gpt2_concat.py`` (written by hand: einsum attention, a concatenated cache
in its own layout), cast to bfloat16: not the reference's own code in bfloat16.
"""

from __future__ import annotations

import pytest
import torch

import introspect
from tests.generate import gpt2_concat
from tests.generate.conftest import PROMPT

STEPS = 6


def _port(gpt2, bug=None, bias_off=False):
    port = gpt2_concat.GPT2(gpt2, bug).eval()
    if bias_off:  # the second block's MLP bias moved: a fault from the prefill on
        with torch.no_grad():
            port.blocks[1]["mlp_c_fc_bias"].add_(0.05)
    return port.to(torch.bfloat16)


def _diff(gpt2, port, noise_budget=True):
    return introspect.diff(gpt2, port, {"input_ids": PROMPT}, generate=STEPS,
                           noise_budget=noise_budget)


def test_a_correct_bfloat16_port_passes_with_the_noise_budget(gpt2):
    result = _diff(gpt2, _port(gpt2))
    assert result.passed, result.summary()
    assert len(result.steps) == STEPS and result.steps["passed"].all()
    assert (result.caches["passed"]).all()
    assert any(n.startswith("noise budget: the reference cast to bfloat16 decoded beside it")
               for n in result.notes), result.notes
    assert result.steps["logits_max_abs_err"].max() > 1e-3  # (bfloat16's rounding: real)


def test_without_it_rounding_fails_and_the_hint_says_so(gpt2):
    result = _diff(gpt2, _port(gpt2), noise_budget=False)
    assert not result.passed
    assert any("noise_budget=True (--noise-budget)" in h
               for h in result.first_divergence.hints)


@pytest.mark.parametrize("fault, step, module", [
    ("bias_off", 0, "transformer.h.1.mlp.c_fc"),
    ("positions-off-by-one", 1, "transformer.wpe"),
    # the step's nodes within their noise: named in the cache (the full diff's nodes, at
    # the default budgets, would name bfloat16's rounding of the embeddings' sum)
    ("update-twice", 1, "cache"),
    ("not-updated", 1, "cache"),
])
def test_a_faulty_bfloat16_port_fails_at_its_step_and_module(gpt2, fault, step, module):
    port = _port(gpt2, bias_off=True) if fault == "bias_off" else _port(gpt2, fault)
    result = _diff(gpt2, port)
    assert not result.passed
    d = result.first_divergence
    assert (d.step, d.module) == (step, module), d
    # the hint to measure the noise is not given where it was measured
    assert not any("noise_budget=True" in h for h in d.hints), d.hints
    if module == "cache":  # the step's nodes were read, and passed: no note says otherwise
        assert not any("could not read node by node" in n for n in result.notes), \
            result.notes
