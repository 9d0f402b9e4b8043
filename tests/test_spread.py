"""Evenly spread indices stay within the tensor at any size (``introspect/spread.py``).

A port holding every weight of MiniLM in one flat parameter (22.7M elements) got exit 2
blaming the port: module evidence's key of the weight took ``torch.linspace`` points in
float32, the last rounding to an index past the end.
"""

from __future__ import annotations

import torch

from introspect.spread import index_dtype, spread


def test_the_last_index_is_the_last_element_past_float32s_integers():
    size = 22_713_728  # float32 rounds size - 1 (odd) up to 22,713,728
    assert int(torch.linspace(0, size - 1, 8).long()[-1]) >= size  # the trap itself
    picks = spread(size, 8)
    assert int(picks[-1]) == size - 1 and int(picks[0]) == 0
    assert bool((picks[1:] > picks[:-1]).all())
    assert index_dtype(size) == torch.float64


def test_below_2_to_the_24_the_points_are_linspaces_own():
    for size, count in ((10, 16), (1000, 16), (2 ** 24, 257)):
        expected = torch.linspace(0, size - 1, min(size, count)).long()
        assert torch.equal(spread(size, count), expected)


def test_a_weight_of_that_size_is_keyed_for_pairing():
    from introspect.diff.modules.pairing import _key

    flat = torch.zeros(22_713_728)
    shape, exact, sample = _key(flat)
    assert shape == (22_713_728,) and not exact and len(sample) == 8 * 4
