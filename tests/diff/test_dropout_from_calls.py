"""The dropout hint reads the candidate's own calls first: where they returned the same
outputs bit for bit, it does not run the candidate twice more; where they differ (a
dropout left on), the two runs are made."""

from __future__ import annotations

import copy

import torch

import introspect
from introspect.diff.hypotheses import dropout
from introspect.run.truth import Truth
from tests.conftest import make_batch


class _DroppedThenGelu(torch.nn.Module):
    """GELU of a dropout of its input, the dropout on in any mode: no value at the
    divergence is the reference's zeroed and scaled (``value_hints`` cannot see it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(torch.nn.functional.dropout(x, 0.1, training=True))


class _TanhGelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def _with_activation(hf: torch.nn.Module, activation: torch.nn.Module) -> torch.nn.Module:
    port = copy.deepcopy(hf)
    port.encoder.layer[1].intermediate.intermediate_act_fn = activation
    generator = torch.Generator().manual_seed(0)
    for name, p in port.named_parameters():  # norms and biases off their init: no fault
        if "LayerNorm" in name or name.endswith("bias"):  # hides behind (1, 0)
            p.data += 0.1 * torch.randn(p.shape, generator=generator)
    return port


def _runs_counted(monkeypatch) -> list[int]:
    made: list[int] = []
    two_runs = dropout._two_runs

    def counted(candidate, inputs):
        made.append(1)
        return two_runs(candidate, inputs)

    monkeypatch.setattr(dropout, "_two_runs", counted)
    return made


def _reference(hf: torch.nn.Module, port: torch.nn.Module) -> torch.nn.Module:
    reference = copy.deepcopy(hf)
    reference.load_state_dict(port.state_dict())  # the same perturbed weights
    return reference


def _diffed(hf: torch.nn.Module, activation: torch.nn.Module):
    port = _with_activation(hf, activation)
    return introspect.diff(_reference(hf, port), port, make_batch(2, 9, padded=True),
                           nodes=False)


def test_a_repeatable_candidate_is_not_run_again_for_the_dropout_hint(tiny_models, monkeypatch):
    made = _runs_counted(monkeypatch)
    result = _diffed(tiny_models("base").model, _TanhGelu())
    assert not result.passed and result.first_divergence.layer == "encoder.layer.1"
    assert made == []  # its four calls agreed: no dropout to look for
    assert not any("dropout" in h for h in result.first_divergence.hints)


def test_the_same_candidate_is_run_twice_where_its_calls_are_not_known_to_agree(
        tiny_models, monkeypatch):
    made = _runs_counted(monkeypatch)
    monkeypatch.setattr(Truth, "repeatable", lambda self: False)
    result = _diffed(tiny_models("base").model, _TanhGelu())
    assert not result.passed and made  # (the skip above came from the calls' evidence)
    assert not any("dropout" in h for h in result.first_divergence.hints)


def test_a_dropout_left_on_is_still_run_twice(tiny_models, monkeypatch):
    made = _runs_counted(monkeypatch)
    result = _diffed(tiny_models("base").model, _DroppedThenGelu())
    assert not result.passed and made  # its calls differ: the hints look again
    assert any("changes from call to call" in note for note in result.notes), result.notes
