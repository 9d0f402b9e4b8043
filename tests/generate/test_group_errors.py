"""The quick steps' measurement of a group of pairs (``quick._group_errors``) answers as
``measure``'s test element for element: the same verdict as reading every element's
error against ``atol + rtol * |reference|`` and every value's finiteness, and the same
largest error; the largest magnitude wherever an error is over ``atol`` (drift reads it
only there)."""

from __future__ import annotations

import pytest
import torch

from introspect.diff.generation.quick import _MEASURED_ALONE, _group_errors

ATOL, RTOL = 1e-5, 1.3e-6


def _every_element(members):
    """The verdict and figures read element by element (the test's own statement)."""
    found = {}
    for i, cand, ref in members:
        a, b = cand.to(torch.float32), ref.to(torch.float32)
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            return None
        d = (a - b).abs()
        if (d > ATOL + RTOL * b.abs()).any():
            return None
        found[i] = (float(d.max()), float(b.abs().max()))
    return found


def _members(seed, sizes, error):
    generator = torch.Generator().manual_seed(seed)
    members = []
    for i, size in enumerate(sizes):
        ref = torch.randn(size, generator=generator) * 100
        cand = ref + error * torch.randn(size, generator=generator)
        members.append((i, cand, ref))
    return members


SIZES = [(3,), (64, 12), (_MEASURED_ALONE + 5,), (2, 7), (2 * _MEASURED_ALONE,)]


@pytest.mark.parametrize("error", [0.0, 1e-6, 5e-5, 1e-3])
@pytest.mark.parametrize("spoil", [None, "nan", "inf", "overflow"])
@pytest.mark.parametrize("where", [0, 2])  # in the concatenation, measured alone
def test_the_group_measures_as_every_element(error, spoil, where):
    members = _members(7, SIZES, error)
    if spoil is not None:
        i, cand, ref = members[where]
        cand = cand.clone()
        if spoil == "overflow":
            cand[1], ref[1] = 3e38, -3e38
        else:
            cand[1] = float(spoil)
        members[where] = (i, cand, ref)
    expected = _every_element(members)
    found = _group_errors(torch.float32, ATOL, RTOL, members)
    if expected is None:
        assert found is None
        return
    assert found is not None and found.keys() == expected.keys()
    for i, (error_found, scale) in found.items():
        assert error_found == expected[i][0]
        if error_found > ATOL:
            assert scale == expected[i][1]


@pytest.mark.parametrize("others", [0, 2])
def test_an_empty_value_has_no_error_alone_or_in_a_group(others):
    """A pair of empty values (a slice of nothing) is within budget with no error; it
    neither raises nor sends the step to the full diff."""
    empty = torch.zeros(0)
    members = [(9, empty, empty.clone())] + _members(3, [(5,), (4, 3)][:others], 1e-6)
    found = _group_errors(torch.float32, ATOL, RTOL, members)
    assert found is not None and found[9] == (0.0, 0.0)
    expected = _every_element(members[1:])
    assert found.keys() == {9, *expected}
    for i, (error, scale) in expected.items():
        assert found[i][0] == error
        if error > ATOL:
            assert found[i][1] == scale
