"""``fit_row_order``, ``fit_token_order``: a candidate's batch rows (its tokens) found among
the reference's, in the order they line up (``ops/compare/layouts.py``)."""

from __future__ import annotations

import torch

from introspect.diff.ops.compare.layouts import (
    TOKENS_ORDER,
    AxisOrder,
    fit_row_order,
    fit_token_order,
    inverse_order,
)


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


def test_tokens_back_to_front_are_found_at_their_padding_and_put_back():
    """A sequence run back to front (round s): each token's values sit at the mirrored
    place; the reference's padded tokens decide nothing, and many tokens (more than one
    block of ``_TOKENS_AT_ONCE``) are matched by a sample of their elements."""
    reference = torch.randn(2, 150, 8, generator=torch.Generator().manual_seed(1))
    candidate = reference.flip(1).clone()
    pad = torch.zeros(2, 150, 1, dtype=torch.bool)
    pad[1, 140:] = True
    candidate[1, :10] = 100.0  # the candidate's own values where the reference pads
    order, in_order, as_they_are = fit_token_order(candidate, reference, pad, axis=1)
    assert order.tolist() == list(range(149, -1, -1))
    assert in_order == 0.0 and as_they_are > 1.0
    flipped = AxisOrder(TOKENS_ORDER, (1,), order)
    assert str(flipped) == "tokens in reverse order"
    assert torch.equal(flipped.to_reference(reference.flip(1)), reference)
    assert torch.equal(flipped.to_candidate(reference), reference.flip(1))


def test_tokens_alike_or_in_their_own_order_give_none():
    reference = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(2))
    assert fit_token_order(reference + 1e-6, reference, None, axis=1) is None
    alike = torch.ones(2, 6, 4)  # (a token-type embedding's: no order of its own)
    assert fit_token_order(alike.flip(1), alike, None, axis=1) is None
