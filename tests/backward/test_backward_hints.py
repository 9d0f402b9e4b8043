"""The training-bug hints, read off two gradients' values (no model needed)."""

from __future__ import annotations

import torch

from introspect.diff.backward.hints import gradient_hints, untied_hint


def _ref() -> torch.Tensor:
    return torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))


def test_zero_on_one_side_is_a_cut():
    ref = _ref()
    (hint,) = gradient_hints(torch.zeros_like(ref), ref, None, cut=True)
    assert "exactly zero in the candidate" in hint and "no gradient reached it" in hint
    (hint,) = gradient_hints(ref, torch.zeros_like(ref), None)
    assert "exactly zero in the reference" in hint


def test_constant_factors_are_named():
    ref = _ref()
    assert any("times 8" in h and "2^3" in h for h in gradient_hints(ref * 8, ref, None))
    assert any("times 0.125" in h and "1/2^3" in h for h in gradient_hints(ref / 8, ref, None))
    assert any("sqrt(12)" in h and "1/sqrt(d)" in h
               for h in gradient_hints(ref * 12 ** 0.5, ref, None))
    assert any("times 12" in h and "mean where the other sums" in h
               for h in gradient_hints(ref * 12, ref, None))
    # noise is no factor
    assert not any("times" in h for h in gradient_hints(ref * (1 + 1e-7), ref, None))
    # a factor that does not hold everywhere is no factor
    off = ref * 2
    off[0, 0] = ref[0, 0] * 3
    assert not any("times" in h for h in gradient_hints(off, ref, None))


def test_dropouts_scale_with_nothing_dropped_is_named():
    """A dropout that drops nothing at a small node scales it by 1/(1-p) alone: named as
    dropout's, on the side that has it (it read "no familiar factor")."""
    ref = _ref()
    assert any("1/(1-0.1): dropout's scale in the candidate only" in h
               for h in gradient_hints(ref / 0.9, ref, None))
    assert any("1-0.2: dropout's scale in the reference only" in h
               for h in gradient_hints(ref * 0.8, ref, None))
    assert any("no familiar factor" in h for h in gradient_hints(ref * 1.3, ref, None))


def test_dropout_pattern():
    ref = _ref()
    keep = torch.rand(ref.shape, generator=torch.Generator().manual_seed(1)) > 0.1
    hints = gradient_hints(ref * keep / 0.9, ref, None)
    assert any("dropout on one side only" in h for h in hints), hints
    assert not any("dropout" in h for h in gradient_hints(ref * 1.5, ref, None))


def test_gradient_into_padded_rows():
    ref = _ref()
    ref[1, 4:] = 0  # the reference gives padded tokens nothing
    pad = torch.zeros(2, 6, 16, dtype=torch.bool)
    pad[1, 4:] = True
    cand = ref.clone()
    cand[1, 4:] = 0.01
    hints = gradient_hints(cand, ref, pad)
    assert any("flows into padded positions" in h for h in hints), hints
    hints = gradient_hints(cand, ref, None)
    assert any("positions the reference's loss ignores" in h for h in hints), hints


def test_weight_rows_the_reference_never_trains():
    ref = torch.randn(10, 4)
    ref[0] = 0
    cand = ref.clone()
    cand[0] = 0.5
    hints = gradient_hints(cand, ref, None, weight=True)
    assert any("row(s) 0 " in h and "padding_idx" in h for h in hints), hints


def test_untied_hint_names_the_copies():
    text = untied_hint("bert.embeddings.word_embeddings.weight", ["emb", "decoder"])
    assert "emb, decoder" in text and "tie them" in text and ";" not in text
