"""GPT-2 ported by hand (tests/ports/gpt2_linear.py): its verdict, and its porting bugs named."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
from introspect.diff.records import STATUS_FAIL
from tests.bounds import above, below
from tests.fixtures.families import tiny_inputs, tiny_model
from tests.ports import gpt2_linear

LAYER = 1
# fault -> (module of the first divergence, its op, how the hint starts)
EXPECTED = {
    "c_proj_untransposed": ("h.1.attn.c_proj", "addmm",
                            "the candidate's h.1.attn.c_proj multiplies by its weight transposed"),
    "qk_swapped": ("h.1.attn", "scaled_dot_product_attention",
                   "the candidate splits its fused projection's output with the query and key "
                   "swapped"),
    "gelu_erf": ("h.1.mlp.act", "NewGELUActivation",
                 "the candidate uses the exact (erf) GELU"),
    "no_causal_mask": ("h.1.attn", "scaled_dot_product_attention",
                       "the candidate's attention has no causal mask"),
    "unscaled": ("h.1.attn", "scaled_dot_product_attention",
                 "the candidate's attention scores are not scaled"),
}


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2"), tiny_inputs("gpt2")


def test_the_port_matches_hf_in_plain_torch_and_each_fault_changes_it(gpt2):
    reference, inputs = gpt2
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        assert below((gpt2_linear.build(reference)(**inputs) - expected).abs().max(), 1e-5)
        for fault in gpt2_linear.FAULTS:
            faulty = gpt2_linear.build(reference, fault, LAYER)(**inputs)
            # a fault's arithmetic, not rounding: the erf GELU for GPT-2's tanh moves 1.36e-5
            # (1.4x the floor); another CPU moves it only by rounding (same on the second path)
            assert above((faulty - expected).abs().max(), 1e-5, fault), fault


def test_the_port_by_hand_passes(gpt2):
    reference, inputs = gpt2
    result = introspect.diff(reference, gpt2_linear.build(reference), inputs)
    assert result.passed and result.first_divergence is None
    assert not any(r.status == STATUS_FAIL for r in result.rows)
    assert result.alignment.coverage > 0.4


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_porting_bug_is_found_where_it_is_and_named(gpt2, fault):
    reference, inputs = gpt2
    result = introspect.diff(reference, gpt2_linear.build(reference, fault, LAYER), inputs)
    first = result.first_divergence
    module, op, hint = EXPECTED[fault]
    assert not result.passed and (first.layer, first.module, first.op) == ("h.1", module, op)
    assert first.hints and first.hints[0].startswith(hint), first.hints
    wrong = [h for h in first.hints for other, (_, _, start) in EXPECTED.items()
             if other != fault and h.startswith(start)]
    assert not wrong, first.hints


def test_fused_weight_blocks_in_another_order_are_named(gpt2):
    reference, inputs = gpt2
    candidate = copy.deepcopy(reference)
    attention = candidate.h[LAYER].attn.c_attn
    with torch.no_grad():  # key and value blocks of the fused (H, 3H) weight swapped
        for tensor, dim in ((attention.weight, 1), (attention.bias, 0)):
            q, k, v = tensor.chunk(3, dim=dim)
            tensor.copy_(torch.cat([q, v, k], dim=dim))
    first = introspect.diff(reference, candidate, inputs).first_divergence
    assert (first.layer, first.module) == ("h.1", "h.1.attn.c_attn")
    assert first.hints[0].startswith("the candidate's fused query/key/value projection "
                                     "(h.1.attn.c_attn) holds the key and value blocks swapped")


def test_a_perturbed_weight_gets_no_gpt2_hint(gpt2):
    reference, inputs = gpt2
    candidate = copy.deepcopy(reference)
    with torch.no_grad():
        candidate.h[LAYER].attn.c_proj.weight[0, 0] += 0.5
    first = introspect.diff(reference, candidate, inputs).first_divergence
    assert first.module == "h.1.attn.c_proj"
    assert not any(word in h for h in first.hints
                   for word in ("transposed", "swapped", "causal", "scaled")), first.hints
