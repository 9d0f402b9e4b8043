"""``--backward`` on a port whose weights are views of one flat Parameter
(``tests/backward/flat_port.py``): no candidate parameter holds a reference weight whole,
so each reference weight is found as a slice of it (``introspect.diff.backward.slices``)
and the slice of its gradient compared. A weight whose view is taken from ``.data`` gets
no gradient at all while every node gradient agrees: the diff PASSED it (probe round g);
it fails now, in its layer, with node tables and without."""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.diff.backward.slices import find_slices
from tests.backward import flat_port
from tests.conftest import make_batch

CUT = "encoder.layer.1.intermediate.dense.weight"


def test_the_correct_flat_port_passes_its_backward(tiny_models):
    hf = tiny_models("base").model
    result = introspect.diff(hf, flat_port.build(hf), make_batch(2, 8, padded=True),
                             backward=True)
    assert result.passed, result.summary()
    assert any(r.relation == "slice of" for r in result.backward.parameter_rows)


@pytest.mark.parametrize("nodes", [True, False])
def test_a_weight_cut_from_its_gradient_fails_the_backward(tiny_models, nodes):
    hf = tiny_models("base").model
    port = flat_port.build(hf, CUT)
    result = introspect.diff(hf, port, make_batch(2, 8, padded=True), backward=True,
                             nodes=nodes)
    assert not result.passed
    assert result.backward.first_divergence.parameter == CUT
    assert result.backward.first_divergence.layer == "encoder.layer.1"
    row = next(r for r in result.backward.parameter_rows if r.reference == CUT)
    assert row.relation == "slice of" and row.status == "fail"


def test_a_weight_found_at_two_places_or_of_one_value_is_no_ones_slice():
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, generator=generator), torch.randn(4, generator=generator)
    reference = {"a": a, "b": b, "ones": torch.ones(3)}
    flat = torch.cat([torch.ones(3), a, b, torch.randn(5, generator=generator)])
    found = find_slices(reference, {"flat": flat}, {"a", "b", "ones"})
    assert {k: v.start for k, v in found.items()} == {"a": 3, "b": 9}
    assert torch.equal(found["b"].of(flat, b.shape), b)
    twice = torch.cat([flat, a])
    assert set(find_slices(reference, {"flat": twice}, {"a", "b"})) == {"b"}
    assert find_slices(reference, {"flat": flat, "copy": a.clone().repeat(2)}, {"a"}) == {}
