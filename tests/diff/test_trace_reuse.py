"""Records kept from the trace (issue 13), and a diff that replays no layer (issue 20)."""

from __future__ import annotations

import copy

import torch

import introspect
from introspect.tracing.shapes import ValueShapeProp, refresh_records
from introspect.tracing.tracer import trace_module
from tests.conftest import make_batch
from tests.test_fast_trace import _Stack


def test_a_run_on_the_traced_shapes_rebuilds_no_record(tiny):
    inputs = make_batch(2, 9, padded=True)
    traced = trace_module(tiny, inputs, cache=False)
    with torch.no_grad():
        ValueShapeProp(traced.gm).propagate(*inputs.values())
    refreshed = refresh_records(traced.records, traced.gm)
    assert all(a is b for a, b in zip(refreshed, traced.records, strict=True))


def test_a_run_on_other_shapes_rebuilds_the_records_that_changed(tiny):
    traced = trace_module(tiny, make_batch(2, 9, padded=True), cache=False)
    with torch.no_grad():  # one more row: the batch dimension changes, the weights do not
        ValueShapeProp(traced.gm).propagate(*make_batch(3, 9, padded=True).values())
    refreshed = refresh_records(traced.records, traced.gm)
    assert refreshed == trace_module(tiny, make_batch(3, 9, padded=True), cache=False).records
    kept = [a is b for a, b in zip(refreshed, traced.records, strict=True)]
    assert any(kept) and not all(kept)  # the weights' records stay, the activations' change
    assert next(r for r in refreshed if r.name == "input_ids").shape == (3, 9)


def test_the_diff_replays_no_layer_a_layer_called_otherwise_is_compared_as_it_ran():
    """The diff records each side as it runs (issue 20): no layer is replayed from another,
    so a layer called with another scale is what it is on each side."""
    torch.manual_seed(0)
    reference = _Stack(scales=(1.0, 2.0, 1.0))
    inputs = {"input_ids": torch.randn(2, 5, 8)}
    result = introspect.diff(reference, copy.deepcopy(reference), inputs)
    assert result.passed
    assert not any("traced in full" in note for note in result.notes)
    other = copy.deepcopy(reference)
    other.scales = (1.0, 2.0, 1.5)  # only the last layer's call differs
    failed = introspect.diff(reference, other, inputs)
    assert not failed.passed
    assert failed.first_divergence.module == "layers.2"
