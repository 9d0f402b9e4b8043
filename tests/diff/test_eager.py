"""The diff's execution path: each side recorded eagerly, replayed to the bit, drift fails.

Every candidate here is HF's own bert-tiny (or llama-tiny) changed in one way that a
symbolic trace does not see (a hook, a Python branch on values, random numbers, an eps
below the budget); the reference has its LayerNorms and biases perturbed so that nothing
is hidden by the identity LayerNorms of random init.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import introspect
from introspect.diff.ops.eager import record_forward
from introspect.tracing.tracer import trace_module


@pytest.fixture(scope="module")
def reference(tiny_models):
    """bert-tiny with every LayerNorm and bias perturbed (seeded), in eval mode."""
    model = copy.deepcopy(tiny_models("base").model).eval()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def inputs(tiny_models):
    loaded = tiny_models("base")
    # two sentence pairs of different lengths: padded, with both segments
    return introspect.tokenize(loaded.tokenizer, ["I love cats!", "Do you?",
                                                  "He hates pineapple pizza.", "So do I."],
                               head="next-sentence")


def test_a_recording_replays_the_model_to_the_bit_and_reads_like_the_trace(reference, inputs):
    tensors = dict(inputs.tensors)
    recording = record_forward(reference, tensors)
    replayed = recording.gm(**tensors)
    eager = reference(**tensors)
    assert torch.equal(replayed["last_hidden_state"], eager.last_hidden_state)
    assert torch.equal(replayed["pooler_output"], eager.pooler_output)
    traced = trace_module(reference, tensors, cache=False)
    ops = [n.op for n in recording.gm.graph.nodes]
    assert ops.count("call_module") == sum(n.op == "call_module" for n in traced.gm.graph.nodes)
    targets = [str(n.target) for n in recording.gm.graph.nodes if n.op == "call_module"]
    assert targets[:2] == ["embeddings.word_embeddings", "embeddings.token_type_embeddings"]
    query = next(n for n in recording.gm.graph.nodes
                 if n.target == "encoder.layer.1.attention.self.query")
    assert list(query.meta["nn_module_stack"])[-1] == "encoder.layer.1.attention.self.query"
    attention = next(n for n in recording.gm.graph.nodes
                     if n.target is F.scaled_dot_product_attention)
    assert list(attention.meta["nn_module_stack"])[-1] == "encoder.layer.0.attention.self"


def _scale_output(module, args, output):
    if isinstance(output, tuple):
        return (output[0] * 1.01, *output[1:])
    return output * 1.01


def test_a_forward_hook_that_changes_a_layer_fails_and_an_observer_passes(reference, inputs):
    hooked = copy.deepcopy(reference)
    hooked.encoder.layer[1].register_forward_hook(_scale_output)
    result = introspect.diff(reference, hooked, inputs)
    assert not result.passed
    assert result.first_divergence.layer in ("encoder.layer.1", "pooler")
    seen = []
    observed = copy.deepcopy(reference)
    observed.encoder.layer[1].register_forward_hook(lambda m, a, o: seen.append(1))
    assert introspect.diff(reference, observed, inputs).passed
    assert seen  # the observer ran: hooks run as they always do


def test_a_hook_on_a_leaf_runs_once_in_the_replay(reference, inputs):
    """A leaf is one node and its hook's ops are nodes of their own: run once, not twice
    (twice would not reproduce the model's outputs, and the diff would say so)."""
    hooked = copy.deepcopy(reference)
    hooked.encoder.layer[0].intermediate.dense.register_forward_hook(_scale_output)
    result = introspect.diff(reference, hooked, inputs)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.0"
    assert not any("not deterministic" in n for n in result.notes)
    twin = copy.deepcopy(hooked)  # the same hook on both sides: the same values
    same = introspect.diff(hooked, twin, inputs)
    assert same.passed, same.notes
    assert float(same.layers.max_abs_err.max()) == 0.0


def test_a_pre_hook_that_changes_a_layers_input_fails(reference, inputs):
    hooked = copy.deepcopy(reference)
    hooked.encoder.layer[1].output.dense.register_forward_pre_hook(
        lambda m, args: (args[0] * 0.99,))
    result = introspect.diff(reference, hooked, inputs)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"


class _BranchOnValues(torch.nn.Module):
    """A port whose forward branches on tensor values: no symbolic trace can hold it."""

    def __init__(self, model: torch.nn.Module, faulty: bool) -> None:
        super().__init__()
        self.model, self.faulty = model, faulty

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        hidden = out.last_hidden_state
        if bool(hidden.abs().max() > 0) and self.faulty:  # data-dependent Python branch
            hidden = hidden + 1e-3
        return {"last_hidden_state": hidden, "pooler_output": out.pooler_output}


def test_a_forward_that_branches_on_values_is_compared(reference, inputs):
    assert introspect.diff(reference, _BranchOnValues(copy.deepcopy(reference), False),
                           inputs).passed
    result = introspect.diff(reference, _BranchOnValues(copy.deepcopy(reference), True), inputs)
    assert not result.passed


class _DropoutLeftOn(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.model(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        return {"last_hidden_state": F.dropout(out.last_hidden_state, 0.1, training=True),
                "pooler_output": out.pooler_output}


def test_random_numbers_in_the_candidate_fail_the_diff(reference, inputs):
    result = introspect.diff(reference, _DropoutLeftOn(copy.deepcopy(reference)), inputs)
    assert not result.passed


def test_an_eps_below_the_dtypes_budget_fails_at_its_add_on_llama():
    """RMSNorm eps 1e-5 for 1e-6: ``var + eps`` moves 9e-6 (under atol 1e-5); the
    outputs move 1e-2. The blame is that add, in the first layer's input norm: the same
    ``add`` on the same values, apart by more than rounding (``ops.twins``; drift, which
    found it before, is the backstop where no pair is one op on the same values)."""
    loaded = introspect.load_model("llama-tiny")
    inputs = introspect.tokenize(loaded.tokenizer)
    candidate = copy.deepcopy(loaded.model)
    for module in candidate.modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = 1e-5
    result = introspect.diff(loaded.model, candidate, inputs)
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module, first.op) == ("layers.0", "layers.0.input_layernorm",
                                                     "add")
    row = result.nodes[result.nodes.reference_node == first.reference_node].iloc[0]
    assert "the same add on the same values" in row.note
    assert introspect.diff(loaded.model, copy.deepcopy(loaded.model), inputs).passed


def test_layer_norm_eps_at_torchs_default_fails_on_bert(reference, inputs):
    candidate = copy.deepcopy(reference)
    for module in candidate.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1e-5
    assert not introspect.diff(reference, candidate, inputs).passed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_correct_low_precision_copies_pass_with_their_noise(reference, inputs, dtype):
    result = introspect.diff(reference, copy.deepcopy(reference).to(dtype), inputs,
                             noise_budget=True)
    assert result.passed, result.first_divergence
