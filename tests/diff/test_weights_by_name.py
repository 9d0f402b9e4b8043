"""Weights settled by name, kept as they are or transposed (a GPT-2 Conv1D weight held by a
port's Linear): the relations the row search finds, without reading the reference's rows."""

from __future__ import annotations

import pytest
import torch

import introspect.scratch as scratch
from introspect.diff.api import record_for_diff
from introspect.diff.ops.align import weights
from introspect.diff.ops.align.view import GraphView


class Conv1D(torch.nn.Module):
    """GPT-2's Conv1D: ``weight`` stored (in, out), applied as ``x @ weight + bias``."""

    def __init__(self, linear: torch.nn.Linear, nudge: bool = False) -> None:
        super().__init__()
        weight = linear.weight.detach().t().contiguous()
        if nudge:  # one value off: no longer the reference's weight transposed
            weight[3, 5] += 0.25
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


def _views(reference, candidate, inputs):
    ref, _, _ = record_for_diff(reference, inputs.tensors, "reference")
    cand, _, _ = record_for_diff(candidate, inputs.tensors, "candidate")
    return (GraphView(ref.gm, ref.records, "reference"),
            GraphView(cand.gm, cand.records, "candidate"))


def _as_set(relations):
    return {(label, r.reference, r.kind, r.region) for label, found in relations.items()
            for r in found}


def _port(tiny, nudge=False):
    port = scratch.BertModel.from_hf(tiny)
    for layer in port.encoder.layer:  # every dense Linear of the MLP held as Conv1D
        layer.intermediate.dense = Conv1D(layer.intermediate.dense, nudge)
        layer.output.dense = Conv1D(layer.output.dense)
    return port


@pytest.mark.parametrize("nudge", [False, True], ids=["transposed", "one-value-off"])
def test_settled_by_name_are_the_relations_the_search_finds(tiny, inputs, monkeypatch, nudge):
    ref, cand = _views(tiny, _port(tiny, nudge), inputs)
    by_name = _as_set(weights.relate_weights(ref, cand))
    with monkeypatch.context() as patch:
        patch.setattr(weights, "_by_name", lambda *args: None)  # every weight searched
        searched = _as_set(weights.relate_weights(ref, cand))
    assert by_name == searched
    transposed = {(label, r) for label, r, kind, _ in by_name if kind == "transposed"}
    assert len(transposed) == (1 if nudge else 2) * len(tiny.encoder.layer)


def test_no_row_of_the_reference_is_read_when_every_weight_settles_by_name(
        tiny, inputs, monkeypatch):
    ref, cand = _views(tiny, _port(tiny), inputs)

    def hashed(rows):
        raise AssertionError("the reference's rows were hashed")

    monkeypatch.setattr(weights, "_row_hashes", hashed)
    relations = weights.relate_weights(ref, cand)
    kinds = {r.kind for found in relations.values() for r in found}
    assert kinds == {"same", "transposed"}


def test_a_square_weight_is_transposed_by_name_unless_it_is_symmetric():
    equalities = weights._Equalities()
    generator = torch.Generator().manual_seed(0)
    square = torch.randn(4, 4, generator=generator)
    symmetric = square + square.t()
    assert weights._by_name(square.t().contiguous(), square, torch.float32,
                            equalities) == "transposed"
    assert weights._by_name(symmetric.t().contiguous(), symmetric, torch.float32,
                            equalities) == "same"
    assert weights._by_name(square + 1, square, torch.float32, equalities) is None
