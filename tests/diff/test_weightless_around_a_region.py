"""A module owning the same weights as a reference module's Linear, and computing more than
it: ``nn.Sequential(Linear, Tanh)`` as a pooler, beside BERT's ``pooler.dense`` and its
weightless ``pooler.activation`` (``pairing.Boundaries.widened``).

Its weights pair it with the region of ``pooler.dense``; its output, tanh of that one, was
held to ``pooler.dense``'s output (the only value there of its shape, and within the
nearness a small pooled value's tanh keeps: 0.227 against 0.223), and a correct port
FAILED by 0.0038 where module evidence decided. The values ``pooler`` returns (it owns
no other weight) are searched too, and the row names ``pooler``."""

from __future__ import annotations

import importlib

import pytest
from torch import nn

import introspect
from tests.ports import hf_like

pairing = importlib.import_module("introspect.diff.modules.pairing")


class SequentialPooler(nn.Module):
    """The first token through ``self.pool = nn.Sequential(Linear, Tanh)``."""

    def __init__(self, proj: nn.Linear, activation: nn.Module) -> None:
        super().__init__()
        self.pool = nn.Sequential(proj, activation)

    def forward(self, x, attention_mask=None):
        return self.pool(x[:, 0])


def _port(reference, activation: nn.Module) -> nn.Module:
    port = hf_like.build(reference)
    port.pooler = SequentialPooler(port.pooler.proj, activation)
    return port.eval()


@pytest.fixture(scope="module")
def inputs(minilm):
    return introspect.tokenize(minilm.tokenizer, ["A small pooled value keeps tanh near its input.",
                                        "Two rows."])


def test_a_sequential_pooler_is_paired_with_the_pooler_and_passes(minilm, inputs):
    result = introspect.diff(minilm.model, _port(minilm.model, nn.Tanh()), inputs,
                             nodes=False)
    assert result.passed, result
    rows = result.modules.set_index("candidate_module")
    assert rows.loc["pooler.pool", "reference_module"] == "pooler"
    assert rows.loc["pooler.pool", "status"] == "ok"
    assert rows.loc["pooler.pool.0", "reference_module"] == "pooler.dense"


def test_a_sequential_pooler_without_its_tanh_fails_at_the_pooler(minilm, inputs):
    result = introspect.diff(minilm.model, _port(minilm.model, nn.Identity()), inputs,
                             nodes=False)
    assert not result.passed
    assert result.first_divergence is not None
    assert result.first_divergence.layer == "pooler"


def test_the_region_widens_only_over_weightless_modules(minilm):
    from introspect.run.capture import capture_calls
    from introspect.run.truth import run_truth

    with capture_calls(minilm.model) as calls:
        run_truth(minilm.model, introspect.tokenize(minilm.tokenizer, ["x"]).tensors)
    boundaries = pairing.reference_boundaries(calls.of_mode("autograd"))
    assert boundaries.widened("pooler.dense") == "pooler"
    assert boundaries.widened("encoder.layer.0.intermediate.dense") == \
        "encoder.layer.0.intermediate"
    assert boundaries.widened("encoder.layer.0.attention.self.query") == \
        "encoder.layer.0.attention.self.query"  # its parent owns key and value too
    assert boundaries.widened("encoder.layer.0.output.LayerNorm") == \
        "encoder.layer.0.output.LayerNorm"
    assert boundaries.widened("") == ""
