"""A norm folded into the Linear after it, its module keeping HF's name
(``ports/gpt2_folded_norm.py``): its weights relate to the reference's by name only, with
other values, and the op level failed the norm's node ("a weight left unloaded") although
every output and every block agreed (probe round j: GPT-2 and Llama, 9.5e-7 and 1.5e-6 at
the outputs). A failing node paired by such weights inside a block that module evidence
passes is a guess: unconfirmed (``ops.divergence.on_a_guess``). The same names with a
fault (gains left unloaded, a fold that drops the shift, a fold off by 1e-4) still fail
in their block."""

from __future__ import annotations

import pytest
import torch
import transformers

import introspect
from tests.adversarial.corpus import port


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000,
                                     n_positions=256)
    reference = transformers.GPT2Model(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # (random init leaves every norm at (1, 0), every bias at 0)
        for parameter in reference.parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    inputs = {"input_ids": torch.randint(0, 1000, (2, 12),
                                         generator=torch.Generator().manual_seed(0)),
              "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    return reference, inputs, port("gpt2_folded_norm.py")


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("build", ["correct", "folded", "gain_folded"])
def test_a_norm_folded_into_the_linear_after_it_passes(gpt2, build, nodes):
    reference, inputs, ports = gpt2
    result = introspect.diff(reference, getattr(ports, build)(reference), inputs, nodes=nodes)
    assert result.passed, result.summary()
    if nodes and build != "correct":
        norms = result.nodes[result.nodes.reference_node.str.endswith("ln_1")]
        assert len(norms) == 4 and (norms.status == "unconfirmed").all(), norms


@pytest.mark.parametrize("build, layer", [
    ("gain_unloaded", "h.0"), ("folded_shift_forgotten", "h.2"), ("folded_gain_off", "h.1")])
def test_a_fault_beside_weights_related_by_name_fails_in_its_block(gpt2, build, layer):
    reference, inputs, ports = gpt2
    result = introspect.diff(reference, getattr(ports, build)(reference), inputs, nodes=False)
    assert not result.passed
    assert result.first_divergence.layer == layer, result.first_divergence
