"""What a block hands the modules inside it (``modules.handovers``): a Llama whose blocks own
their Linears and normalize between them in plain code (``tests/ports/llama_block_norms.py``).

Module evidence sees the block and its Linears, not the norm. With the residual stream
ten times the default init's, an RMSNorm eps of 1e-5 for 1e-6 after the attention moves
the block's output by less than the block's budget: the block passed, and on a random
1.1B Llama whose norms are custom ops the whole diff PASSED. The block's run on the
reference's inputs hands its ``down`` Linear a value the pairing holds to the reference's
``mlp.down_proj`` input; their gap, over 8x its own noise plus 16 roundings, fails the
block, in its layer, and the recording made inside it then names the norm's ``add``.
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

import introspect
from tests.fixtures.families import grouped_llama, tiny_inputs
from tests.ports import bert_rows_vmapped, llama_block_norms

evidence = importlib.import_module("introspect.diff.modules.evidence")
whole_models = importlib.import_module("introspect.diff.flow.whole_models")
flow_evidence = importlib.import_module("introspect.diff.flow.module_evidence")


@pytest.fixture(scope="module")
def loud_llama():
    """``grouped_llama`` with its embeddings ten times as large (a residual stream whose
    magnitude sets the block's budget, as a deep model's does)."""
    reference = copy.deepcopy(grouped_llama())
    with torch.no_grad():
        reference.embed_tokens.weight.mul_(10.0)
    return reference


def test_the_block_port_passes(loud_llama):
    result = introspect.diff(loud_llama, llama_block_norms.build(loud_llama),
                             tiny_inputs("llama"), nodes=False)
    assert result.passed, result.summary()
    assert not result.modules["note"].str.startswith("what it hands").any()


def test_an_eps_between_the_linears_fails_the_block_by_what_it_hands(loud_llama):
    result = introspect.diff(loud_llama, llama_block_norms.build(loud_llama, "eps"),
                             tiny_inputs("llama"), nodes=False)
    assert not result.passed, result.summary()
    modules = result.modules
    block = modules[modules["candidate_module"] == "blocks.2"].iloc[0]
    assert block["status"] == "fail", block.to_dict()
    assert block["note"].startswith("what it hands blocks.2."), block["note"]
    assert block["max_abs_err"] > block["limit"]
    # the block failing, its op-level evidence is recorded inside it: the eps's add,
    # the same op on the reference's values on both sides (``ops.twins``), is named
    divergence = result.first_divergence
    assert divergence.layer == "layers.2", divergence
    assert divergence.module == "layers.2.post_attention_layernorm", divergence
    assert divergence.candidate_module == "blocks.2", divergence
    others = modules[(modules["status"] == "fail") & (modules["candidate_module"] != "blocks.2")]
    assert others.empty, others.to_dict("records")  # nothing else fails, before or after


def test_without_the_handovers_the_block_passes(loud_llama, monkeypatch):
    """What the hand-overs add: the block's own local error is within its budget (and
    its float64 run, which fails the block too, is off here)."""
    monkeypatch.setattr(evidence, "_handed_over", lambda row, *args: row)
    monkeypatch.setattr(evidence, "CONFIRM_SHARE", float("inf"))
    result = introspect.diff(loud_llama, llama_block_norms.build(loud_llama, "eps"),
                             tiny_inputs("llama"), nodes=False)
    modules = result.modules
    block = modules[modules["candidate_module"] == "blocks.2"].iloc[0]
    assert block["status"] == "ok", block.to_dict()


@pytest.fixture(scope="module")
def perturbed_tiny(tiny_models):
    """bert-tiny of its own, norms and biases perturbed, and the tutorial's inputs."""
    from introspect.models.load import tokenize
    from tests.fixtures.families import perturb_vectors

    loaded = tiny_models("base", "sdpa")
    return perturb_vectors(copy.deepcopy(loaded.model)), tokenize(loaded.tokenizer).tensors


@pytest.mark.parametrize("handovers", [True, False])
def test_an_eps_in_a_row_mapped_by_vmap(perturbed_tiny, monkeypatch, handovers):
    """``tests/ports/bert_rows_vmapped.py``: each layer written for one sequence, mapped
    over the rows by ``vmap``, its LayerNorms by hand. The layer's run hands its Linears
    batched tensors, read as the whole batch (as the capture kept their calls): what it
    hands ``fc1`` after the attention LayerNorm's eps of 1e-5 for 1e-12 fails the layer,
    whose own output is within its rounding. Without the hand-overs (and without the
    float64 run, which fails the layer too: below) the diff PASSED."""
    reference, inputs = perturbed_tiny
    if not handovers:
        monkeypatch.setattr(evidence, "_handed_over", lambda row, *args: row)
        monkeypatch.setattr(evidence, "CONFIRM_SHARE", float("inf"))
        monkeypatch.setattr(whole_models, "computed_outside_modules", lambda e: False)
        monkeypatch.setattr(flow_evidence, "computed_by_glue", lambda *calls: [])
    assert introspect.diff(reference, bert_rows_vmapped.build(reference), inputs,
                           nodes=False).passed
    result = introspect.diff(reference, bert_rows_vmapped.build(reference, "eps"), inputs,
                             nodes=False)
    assert result.passed is not handovers, result.summary()
    if handovers:
        divergence = result.first_divergence
        assert divergence.layer == "encoder.layer.1", divergence
        assert "what it hands layers.1.fc1 (args.0)" in divergence.detail, divergence.detail


def test_an_eps_in_a_row_mapped_by_vmap_fails_in_float64_too(perturbed_tiny, monkeypatch):
    """The same slip with the hand-overs off: the layer, within its float32 budget, run
    again in float64 is apart from the reference's (``modules.precise``)."""
    reference, inputs = perturbed_tiny
    monkeypatch.setattr(evidence, "_handed_over", lambda row, *args: row)
    result = introspect.diff(reference, bert_rows_vmapped.build(reference, "eps"), inputs,
                             nodes=False)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"
    assert "run again in float64" in result.first_divergence.detail
