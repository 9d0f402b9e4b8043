"""``run.same_bytes``: a weight's proof at the memory's speed, never a false "equal"."""

from __future__ import annotations

import torch

from introspect.diff.modules.pairing import _equal, relate_parameters
from introspect.run.same_bytes import same_bytes


def test_the_same_bytes_and_only_they():
    a = torch.randn(64, 48)
    b = a.clone()
    assert same_bytes(a, b)
    last = b.view(-1)
    last[-1] = torch.nextafter(last[-1], torch.tensor(float("inf")))  # one ulp, last element
    assert not same_bytes(a, b)
    assert same_bytes(a[1:], a.clone()[1:])  # a view's own offset is where it starts
    assert not same_bytes(a[1:], a[:-1])
    assert same_bytes(torch.empty(0), torch.empty(0))


def test_another_layout_says_nothing_and_torch_equal_decides():
    a = torch.randn(8, 6)
    assert not same_bytes(a.t(), a.t().contiguous())  # (strides differ: not compared)
    assert _equal(a.t(), a.t().contiguous())
    assert not same_bytes(a, a.double())
    zeros, negative = torch.zeros(5), -torch.zeros(5)
    assert not same_bytes(zeros, negative) and _equal(zeros, negative)  # -0.0 == 0.0


def test_a_weight_holding_the_references_nan_bit_for_bit_is_its_weight():
    reference = torch.nn.Linear(40, 40)
    with torch.no_grad():
        reference.weight[3, 5] = float("nan")
    candidate = torch.nn.Linear(40, 40)
    candidate.load_state_dict(reference.state_dict())
    assert relate_parameters(reference, candidate)["weight"] == {"weight"}
    with torch.no_grad():
        candidate.weight[39, 39] += 1e-3  # one element off: no relation
    assert relate_parameters(reference, candidate)["weight"] == set()
