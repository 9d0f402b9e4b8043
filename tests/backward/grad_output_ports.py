"""Small models whose custom backward edits its ``grad_output`` in place, written by hand.

Imports only torch. ``Reference`` is the model; ``build(reference, fault)`` is a port in
another hand (its own parameters, its own GELU as an ``autograd.Function`` whose backward
scales ``grad_output`` in place and returns it):

- ``None``: a correct port;
- ``"term"``: the backward's derivative forgets the ``x * pdf(x)`` term;
- ``"hook"``: a tensor hook that scales the hidden's gradient by 1.01 in place, after
  the gradient was handed out;
- ``"term_then_drifts"``: the forgotten term, and from its sixth call on an output
  scaled by 1.001 (a forward run again for the local backwards is not the same run);
- ``"reference_edits"`` is not a port: ``Reference(edits=True)`` is the reference whose own
  GELU backward edits in place (its node gradients must be the ones autograd made).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _pdf(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _cdf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class _InPlaceGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forget_term):
        ctx.save_for_backward(x)
        ctx.forget_term = forget_term
        return x * _cdf(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        derivative = _cdf(x) if ctx.forget_term else _cdf(x) + x * _pdf(x)
        grad.mul_(derivative)  # in place: the caller's gradient, edited
        return grad, None


class Reference(nn.Module):
    def __init__(self, edits: bool = False) -> None:
        super().__init__()
        self.edits = edits
        self.up = nn.Linear(6, 12)
        self.norm = nn.LayerNorm(12)
        self.down = nn.Linear(12, 4)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.up(x))
        h = _InPlaceGelu.apply(h, False) if self.edits else nn.functional.gelu(h)
        return self.down(h)


class Port(nn.Module):
    def __init__(self, reference: Reference, fault: str | None) -> None:
        super().__init__()
        self.fault = fault
        self.calls = 0
        state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
        self.w1, self.b1 = nn.Parameter(state["up.weight"]), nn.Parameter(state["up.bias"])
        self.g, self.beta = nn.Parameter(state["norm.weight"]), nn.Parameter(state["norm.bias"])
        self.w2, self.b2 = nn.Parameter(state["down.weight"]), nn.Parameter(state["down.bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w1.t() + self.b1
        h = nn.functional.layer_norm(h, (h.shape[-1],), self.g, self.beta, 1e-5)
        if self.fault == "hook" and h.requires_grad:
            h.register_hook(lambda grad: grad.mul_(1.01))
        h = _InPlaceGelu.apply(h, self.fault in ("term", "term_then_drifts"))
        self.calls += 1
        scale = 1.001 if self.fault == "term_then_drifts" and self.calls > 5 else 1.0
        return (h @ self.w2.t() + self.b2) * scale


def build(reference: Reference, fault: str | None = None) -> Port:
    return Port(reference, fault)


def loss(outputs, inputs):
    return (outputs * torch.linspace(-1.0, 1.0, outputs.shape[-1])).sum()
