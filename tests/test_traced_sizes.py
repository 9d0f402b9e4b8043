"""Traced sizes used as ports use them: factories with separate sizes, ``*x.shape``, ``len``."""

from __future__ import annotations

import pickle

import pytest
import torch

from introspect.tracing.traced_sizes import FACTORIES
from introspect.tracing.tracer import trace_module

USES = {
    "ones(S, S)": lambda x, B, S: torch.ones(S, S).tril(),
    "zeros(B, S)": lambda x, B, S: torch.zeros(B, S) + x,
    "empty(B, S)": lambda x, B, S: torch.empty(B, S).fill_(2.0) * x,
    "rand(B, S)": lambda x, B, S: torch.rand(B, S) * 0 + x,
    "randn(S, S)": lambda x, B, S: torch.randn(S, S).sum() * 0 + x,
    "ones(*x.shape)": lambda x, B, S: torch.ones(*x.shape) * x,
    "len(x.shape)": lambda x, B, S: x * len(x.shape),
    "tuple(x.shape)": lambda x, B, S: x.new_zeros(tuple(x.shape)) + x,
}


class _Uses(torch.nn.Module):
    def __init__(self, use) -> None:
        super().__init__()
        self.use = use

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = input_ids.float()
        B, S = x.shape
        return self.use(x, B, S)


@pytest.mark.parametrize("use", sorted(USES))
def test_a_traced_size_works_where_ports_put_it_and_stays_symbolic(use):
    model = _Uses(USES[use])
    traced = trace_module(model, {"input_ids": torch.ones(2, 5, dtype=torch.long)}, cache=False)
    torch.manual_seed(0)
    for shape in ((2, 5), (3, 7)):  # another batch and length than the trace's
        ids = torch.arange(shape[0] * shape[1]).reshape(shape)
        got = traced.gm(input_ids=ids)["output"]
        expected = model(input_ids=ids)
        assert got.shape == expected.shape
        if "rand" not in use:
            assert torch.equal(got, expected)


def test_the_factories_are_put_back_and_untraced_calls_untouched():
    originals = {name: getattr(torch, name) for name in FACTORIES}
    traced = trace_module(_Uses(USES["ones(S, S)"]), {"input_ids": torch.ones(2, 5).long()},
                          cache=False)
    assert {name: getattr(torch, name) for name in FACTORIES} == originals
    assert any(n.target is torch.ones for n in traced.gm.graph.nodes)  # torch's own, recorded
    pickle.loads(pickle.dumps(traced.gm))  # the generated code names torch.ones
