"""The diff spends no pass on shapes: it keeps the trace's records and notes (issue 13)."""

from __future__ import annotations

import copy

import torch

import introspect
from introspect.shapes import ValueShapeProp, refresh_records
from introspect.tracer import trace_module
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


def test_the_diff_keeps_the_trace_notes_of_each_side():
    torch.manual_seed(0)
    reference = _Stack(scales=(1.0, 2.0, 1.0))  # layer 1 is called differently: traced in full
    result = introspect.diff(reference, copy.deepcopy(reference),
                             {"input_ids": torch.randn(2, 5, 8)})
    assert result.passed
    for side in ("reference", "candidate"):
        assert (f"the {side}'s layer layers.1 was traced in full: its arguments differ from "
                "those of layers.0") in result.notes
