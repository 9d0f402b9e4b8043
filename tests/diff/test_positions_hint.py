"""The position-ids hint: an index tensor shifted by a constant, recognised by value."""

from __future__ import annotations

import torch

from introspect.diff.hypotheses import positions
from introspect.diff.hypotheses.context import DivergenceContext


def _context(reference: torch.Tensor, candidate: torch.Tensor) -> DivergenceContext:
    return DivergenceContext(torch.nn.Identity(), None, {}, "getitem_2", "add", "embeddings",
                             "embeddings", reference, candidate, 1e-5, 1.3e-6)


def test_positions_counted_from_another_start_get_the_hint():
    reference = torch.arange(9).unsqueeze(0)  # (1, S), as HF slices its buffer
    (hint,) = positions.hints(_context(reference, reference + 2))
    assert "offset by +2" in hint and "from 2" in hint


def test_other_differences_get_no_position_hint():
    reference = torch.arange(9).unsqueeze(0)
    shuffled = reference.flip(-1)
    assert positions.hints(_context(reference, shuffled)) == []  # not a constant shift
    assert positions.hints(_context(reference, reference)) == []  # no shift at all
    ids = torch.tensor([[101, 2023, 102]])  # counts nothing: token ids, not positions
    assert positions.hints(_context(ids, ids + 1)) == []
    floats = torch.arange(9.0).unsqueeze(0)
    assert positions.hints(_context(floats, floats + 1)) == []
