"""``fit_row_order``: a candidate's batch rows found among the reference's, in the order
they line up (``ops/compare/layouts.py``)."""

from __future__ import annotations

import torch

from introspect.diff.ops.compare.layouts import fit_row_order, inverse_order


def _batch(rows: int = 3) -> torch.Tensor:
    return torch.randn(rows, 5, 8, generator=torch.Generator().manual_seed(0))


def test_rows_in_another_order_are_found_and_put_back():
    reference = _batch()
    candidate = reference[[2, 0, 1]]
    order, in_order, as_they_are = fit_row_order(candidate, reference, None)
    assert order.tolist() == [2, 0, 1]
    assert in_order == 0.0 and as_they_are > 1.0
    assert torch.equal(candidate.index_select(0, inverse_order(order)), reference)


def test_rows_in_their_own_order_and_single_rows_give_none():
    reference = _batch()
    assert fit_row_order(reference + 1e-6, reference, None) is None
    assert fit_row_order(reference[:1], reference[:1], None) is None


def test_padded_positions_do_not_decide_the_order():
    reference = _batch(2)
    candidate = reference.flip(0).clone()
    pad = torch.zeros(2, 5, 1, dtype=torch.bool)
    pad[0, 3:] = True  # reference row 0 pads its last two positions
    candidate[1, 3:] = 100.0  # where the candidate's row 1 (the reference's 0) is its own
    order, in_order, _ = fit_row_order(candidate, reference, pad)
    assert order.tolist() == [1, 0] and in_order == 0.0
