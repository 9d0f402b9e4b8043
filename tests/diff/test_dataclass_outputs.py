"""A ``@dataclass`` output is compared field by field, as a dict is (issue 41: it was
refused with "shares weights with only 0 of 17 weighted nodes")."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

import introspect
from introspect.run.outputs import flatten_outputs
from tests.diff import dataclass_port


@pytest.fixture(scope="module")
def diffs(tiny, inputs):
    ports, reference = dataclass_port, SimpleNamespace(model=tiny, config=tiny.config)
    return {name: introspect.diff(tiny, getattr(ports, name)(reference), inputs)
            for name in ("correct", "faulty", "nested")}


@pytest.mark.parametrize("name", ["correct", "nested"])
def test_a_dataclass_output_passes_field_by_field(diffs, name):
    result = diffs[name]
    assert result.passed, result.notes
    outputs = result.outputs
    assert set(outputs.reference_output) == {"last_hidden_state", "pooler_output"}
    assert (outputs.status == "ok").all()
    expected = {"correct": {"last_hidden_state", "pooler_output"},
                "nested": {"output_0.last_hidden_state", "output_0.pooler_output"}}[name]
    assert set(outputs.candidate_output) == expected


def test_a_fault_in_one_field_fails(diffs):
    result = diffs["faulty"]
    assert not result.passed
    failing = result.outputs[result.outputs.status == "fail"]
    assert set(failing.reference_output) == {"last_hidden_state"}


def test_dataclass_fields_flatten_by_name():
    @dataclass
    class Inner:
        value: torch.Tensor
        label: str = "x"

    @dataclass
    class Outer:
        inner: Inner
        scores: torch.Tensor

    leaves = flatten_outputs(Outer(Inner(torch.ones(2)), torch.zeros(3)))
    assert sorted(leaves) == ["inner.value", "scores"]
    assert sorted(flatten_outputs(Inner)) == []  # a class is no output
