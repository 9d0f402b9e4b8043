"""``cast_copy``: a model in another dtype in one copy, or none, or a refusal with the sizes."""

from __future__ import annotations

import pytest
import torch

from introspect.diff.copies import cast_copy
from introspect.errors import InputError


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight  # tied, as LM heads are
        self.register_buffer("positions", torch.arange(16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(ids)))


def test_a_model_already_in_the_dtype_is_handed_back_not_copied():
    model = Tied().to(torch.bfloat16)
    assert cast_copy(model, torch.bfloat16) is model


def test_the_copy_casts_floats_keeps_ties_and_leaves_the_original_alone(monkeypatch):
    model = Tied().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def no_deep_copy(self, memo):  # a tensor copied in its own dtype first: two copies
        raise AssertionError("an original tensor was deep-copied")

    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", no_deep_copy)
    monkeypatch.setattr(torch.Tensor, "__deepcopy__", no_deep_copy)
    exact = cast_copy(model, torch.float64)
    monkeypatch.undo()
    assert exact is not model and not exact.training
    assert exact.head.weight is exact.embed.weight
    assert exact.embed.weight.dtype == torch.float64 and exact.positions.dtype == torch.int64
    assert isinstance(exact.norm.weight, torch.nn.Parameter)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.embed.weight.dtype == torch.float32
    ids = torch.tensor([[1, 2, 3]])
    assert torch.allclose(exact(ids).float(), model(ids), atol=1e-5)


def test_a_copy_larger_than_the_memory_is_refused_with_its_size():
    model = Tied()
    with pytest.raises(InputError, match=r"--noise-budget needs the model in float64: a copy "
                                         r"of .* GiB, more than the .* available"):
        cast_copy(model, torch.float64, what="--noise-budget", memory=1000)
