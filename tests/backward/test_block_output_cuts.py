"""A GPT-2 port in nanoGPT's style (``tests/diff/nanogpt_gpt2_port.py``: imports only
torch) whose first block cuts or scales the gradient at its own output, inside its own
forward: the block returns its output detached, or puts a tensor hook on it that scales
the gradient by 1.05. The forward is the reference's; the port trains wrong from that
block down. Probe round m named such faults in the *next* block: the gradient read at the
block's output was the one the port's hook had made (ours ran after it), and the local
backward of the next block's residual add lost what it handed back (a cut). Both are now
named in the block that holds them, with and without node tables."""

from __future__ import annotations

import pytest
import torch

import introspect
from tests.diff import nanogpt_gpt2_port
from tests.fixtures.families import perturb_vectors, tiny_model


@pytest.fixture(scope="module")
def gpt2():
    reference = perturb_vectors(tiny_model("gpt2", head="causal-lm"), scale=0.1)
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(5, 100, (2, 9), generator=g),
              "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    return reference, inputs


@pytest.mark.parametrize("nodes", [False, True], ids=["own-backward", "node-tables"])
def test_the_correct_port_passes_its_backward(gpt2, nodes):
    reference, inputs = gpt2
    result = introspect.diff(reference, nanogpt_gpt2_port.build(reference), inputs,
                             backward=True, nodes=nodes)
    assert result.passed and result.backward.passed, result.summary()


@pytest.mark.parametrize("nodes", [False, True], ids=["own-backward", "node-tables"])
@pytest.mark.parametrize("fault, words", [("output_detached", "cuts the graph"),
                                          ("output_hooked", "times 1.05")])
def test_a_block_cutting_or_scaling_its_output_gradient_is_named(gpt2, fault, words, nodes):
    reference, inputs = gpt2
    result = introspect.diff(reference, nanogpt_gpt2_port.build(reference, fault, 0), inputs,
                             backward=True, nodes=nodes)
    assert not result.passed and not result.backward.passed
    assert (result.outputs["status"] == "ok").all()  # the forward is the reference's
    d = result.backward.first_divergence
    assert d.layer == "h.0" and d.candidate_module.startswith("h.0"), d
    assert result.first_divergence.layer == "h.0"
    assert any(words in hint for hint in d.hints), d.hints
    # no row was over its budget (the gradient changed between aligned ops): no note may
    # count "0 gradient(s) over the default budget" (probe round n)
    assert not any(note.startswith("0 ") for note in result.backward.notes), \
        result.backward.notes
