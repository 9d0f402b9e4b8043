"""Diff across the family: each against itself, sdpa against eager, and one fault each."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import introspect
from tests.bounds import below
from tests.fixtures.families import TINY, tiny_inputs, tiny_model


@pytest.mark.parametrize("family", list(TINY))
def test_each_family_against_itself_passes_at_zero(family):
    model = tiny_model(family)
    result = introspect.diff(model, copy.deepcopy(model), tiny_inputs(family))
    assert result.passed and result.first_divergence is None
    assert result.nodes["max_abs_err"].max() == 0.0


@pytest.mark.parametrize("family", list(TINY))
def test_sdpa_against_eager_passes_within_fp32_noise(family):
    result = introspect.diff(tiny_model(family), tiny_model(family, attn="eager"),
                             tiny_inputs(family))
    assert result.passed
    assert below(result.nodes["max_abs_err"].max(), 1e-4, family)


def _layer_norm_eps(m: nn.Module) -> None:  # RoBERTa: eps 1e-3 instead of 1e-12
    m.encoder.layer[1].attention.output.LayerNorm.eps = 1e-3


def _value_weight(m: nn.Module) -> None:  # DistilBERT: one value weight off
    with torch.no_grad():
        m.transformer.layer[1].attention.v_lin.weight[0, 0] += 0.1


def _intermediate_bias(m: nn.Module) -> None:  # ELECTRA
    with torch.no_grad():
        m.encoder.layer[1].intermediate.dense.bias += 0.05


def _shared_ffn_bias(m: nn.Module) -> None:  # ALBERT: the shared layer, so from call 0 on
    with torch.no_grad():
        m.encoder.albert_layer_groups[0].albert_layers[0].ffn.bias += 0.05


def _erf_gelu(m: nn.Module) -> None:  # GPT-2 uses the tanh GELU; a port with erf's
    m.h[1].mlp.act = nn.GELU()


def _rms_norm_eps(m: nn.Module) -> None:  # Llama: RMSNorm eps 1e-2 instead of 1e-6
    m.layers[1].post_attention_layernorm.variance_epsilon = 1e-2


FAULTS: dict[str, tuple[Callable[[nn.Module], None], str, str]] = {
    # family: (fault, layer, module where it must be found)
    "roberta": (_layer_norm_eps, "encoder.layer.1", "encoder.layer.1.attention.output.LayerNorm"),
    "distilbert": (_value_weight, "transformer.layer.1", "transformer.layer.1.attention.v_lin"),
    "electra": (_intermediate_bias, "encoder.layer.1", "encoder.layer.1.intermediate.dense"),
    "albert": (_shared_ffn_bias, "encoder.layer.0",
               "encoder.albert_layer_groups.0.albert_layers.0.ffn"),
    "gpt2": (_erf_gelu, "h.1", "h.1.mlp.act"),
    "llama": (_rms_norm_eps, "layers.1", "layers.1.post_attention_layernorm"),
}


@pytest.mark.parametrize("family", list(FAULTS))
def test_an_injected_fault_is_found_at_its_layer_and_module(family):
    fault, layer, module = FAULTS[family]
    model = tiny_model(family)
    faulty = copy.deepcopy(model)
    fault(faulty)
    result = introspect.diff(model, faulty, tiny_inputs(family))
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module) == (layer, module)
