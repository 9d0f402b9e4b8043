"""The truth calls with autograd on keep nothing for a backward (``run.truth``), yet return
what a plain call returns, bit for bit; a forward that runs a backward of its own still
runs."""

from __future__ import annotations

import weakref

import torch

from introspect.run.truth import identical, run_truth
from tests.conftest import make_batch


class Keeps(torch.nn.Module):
    """Notes whether a value autograd saves outlives the Python name that held it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))
        self.alive: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (x * 2).exp()
        seen = weakref.ref(h)
        y = h * self.w  # mul saves h for its backward
        del h
        self.alive.append(seen() is not None)
        return y


class GradientInside(torch.nn.Module):
    """A forward that takes a gradient (a force from an energy): it reads what it saved."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            energy = ((x * self.w).sin() ** 2).sum()
            (force,) = torch.autograd.grad(energy, x, create_graph=torch.is_grad_enabled())
        return -force


def test_an_autograd_truth_call_keeps_nothing_for_a_backward():
    model = Keeps()
    truth = run_truth(model, {"x": torch.randn(3, 4)})
    assert model.alive == [False, False]  # the autograd call; no_grad saves nothing anyway
    plain = Keeps()
    plain.w = model.w
    plain(torch.randn(3, 4))
    assert plain.alive == [True]  # what a plain call keeps
    assert truth.grad_outputs["output"].shape == (3, 4)


def test_the_outputs_are_a_plain_calls_bit_for_bit(tiny_models):
    model = tiny_models("base").model.eval()
    batch = make_batch(2, 8, padded=True)
    truth = run_truth(model, batch)
    plain = model(**{name: t.clone() for name, t in batch.items()})
    for name in ("last_hidden_state", "pooler_output"):
        assert identical(truth.grad_outputs[name], plain[name].detach())
        assert plain[name].grad_fn is not None


def test_a_forward_that_takes_a_gradient_still_runs():
    model = GradientInside()
    x = torch.randn(3, 4)
    truth = run_truth(model, {"x": x}, grad_calls=2)
    assert identical(truth.grad_outputs["output"], model(x).detach())
    assert not truth.changed_between_calls()
