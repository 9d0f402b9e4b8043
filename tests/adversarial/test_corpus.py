"""The corpus itself, with plain eager torch and no introspect.diff: every faulty twin's
output really differs from the reference's, and every correct twin's does not beyond fp32
noise. (If this fails, the diff tests below prove nothing.)"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.adversarial.corpus import MECHANISMS, ON_MINILM, port
from tests.bounds import above, below

FP32_NOISE = 1e-5  # correct twins: the largest difference on real tokens
# faulty twins: at least this (ten budgets of atol). The faults' effect is their arithmetic
# (the tanh GELU is up to 4.7e-4 off erf's), 2.2e-4 at bert-tiny's outputs on any CPU: a
# margin of 2.2x that rounding (~1e-6 here) cannot eat; not a bound on rounding error.
VISIBLE = 1e-4


def output_error(reference, candidate, inputs) -> float:
    """Max abs difference of the last hidden state on real (unpadded) tokens."""
    tensors = dict(inputs.tensors)
    mask = tensors["attention_mask"].bool()
    with torch.no_grad():
        ref, cand = reference(**tensors), candidate(**tensors)
    ref = ref["last_hidden_state"] if isinstance(ref, dict) else ref[0]
    cand = cand["last_hidden_state"] if isinstance(cand, dict) else cand[0]
    return (cand.double() - ref.double())[mask].abs().max().item()


@pytest.mark.parametrize("name", MECHANISMS)
def test_faulty_differs_and_correct_does_not(name, tiny):
    reference, inputs = tiny
    module = port(f"{name}.py")
    correct = output_error(reference.model, module.correct(reference), inputs)
    faulty = output_error(reference.model, module.faulty(reference), inputs)
    assert below(correct, FP32_NOISE, "correct") and above(faulty, VISIBLE, "faulty"), \
        (correct, faulty)


def test_the_two_same_named_files(tiny):
    reference, inputs = tiny
    assert below(output_error(reference.model, port("same_name_a/port.py").build(reference),
                              inputs), FP32_NOISE, "correct")
    assert above(output_error(reference.model, port("same_name_b/port.py").build(reference),
                              inputs), VISIBLE, "faulty")


def test_builders_leave_the_reference_alone(tiny):
    reference, _ = tiny
    before = {k: v.clone() for k, v in reference.model.state_dict().items()}
    for name in MECHANISMS:
        module = port(f"{name}.py")
        module.faulty(reference), module.correct(reference)
    after = reference.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_reference_is_perturbed(tiny):
    """LayerNorms off (1, 0) and biases off 0: a random init would hide faults."""
    model = tiny[0].model
    norm = model.encoder.layer[1].output.LayerNorm
    assert (norm.weight - 1).abs().min() > 0 and norm.bias.abs().min() > 0
    assert model.encoder.layer[1].intermediate.dense.bias.abs().max() > 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ON_MINILM)
def test_on_minilm_the_fault_is_in_layer_3_and_visible(name, mini):
    reference, inputs = mini
    module = port(f"{name}.py")
    correct = output_error(reference.model, module.correct(reference), inputs)
    faulty = output_error(reference.model, module.faulty(reference), inputs)
    assert below(correct, FP32_NOISE, "correct") and above(faulty, VISIBLE, "faulty"), \
        (correct, faulty)


def set_eps(model: torch.nn.Module, eps: float) -> torch.nn.Module:
    """Every LayerNorm / RMSNorm of an HF model (and its config) at ``eps``."""
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = eps
        elif hasattr(module, "variance_epsilon"):
            module.variance_epsilon = eps
    key = "rms_norm_eps" if hasattr(model.config, "rms_norm_eps") else "layer_norm_eps"
    setattr(model.config, key, eps)
    return model


def test_eps_one_decade_off_is_visible(tiny, llama_tiny):
    """RMSNorm 1e-5 vs 1e-6 on llama-tiny and LayerNorm 1e-5 vs 1e-6 on the perturbed
    bert-tiny change the outputs by ~1e-2 and ~3e-3. (bert-tiny's own 1e-12 vs 1e-11
    changes nothing in fp32: no tool can see it, so it is not in the corpus.)"""
    llama, llama_inputs = llama_tiny
    wrong = set_eps(copy.deepcopy(llama.model), 1e-5)
    assert llama.model.config.rms_norm_eps == 1e-6
    assert output_error(llama.model, wrong, llama_inputs) > 1e-3
    reference, inputs = tiny
    six = set_eps(copy.deepcopy(reference.model), 1e-6)
    assert output_error(six, set_eps(copy.deepcopy(six), 1e-5), inputs) > 1e-3
    assert output_error(reference.model, set_eps(copy.deepcopy(reference.model), 1e-11),
                        inputs) == 0.0
