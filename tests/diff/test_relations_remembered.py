"""Weight relations answered from memory (``align.weights.relations_remembered``, used by
generation): the same relations as computed afresh, and a weight changed since is read
again, whichever way it changed."""

from __future__ import annotations

import copy
import gc

import pytest
import torch

import introspect.scratch as scratch
from introspect.diff.api import record_for_diff
from introspect.diff.ops.align.view import GraphView
from introspect.diff.ops.align.weights import relate_weights, relations_remembered


def _views(reference, candidate, inputs):
    ref, _, _ = record_for_diff(reference, inputs.tensors, "reference")
    cand, _, _ = record_for_diff(candidate, inputs.tensors, "candidate")
    return (GraphView(ref.gm, ref.records, "reference"),
            GraphView(cand.gm, cand.records, "candidate"))


class TransposedLinear(torch.nn.Module):
    """A Linear holding its weight transposed, as a GPT-2 style port holds Conv1D weights:
    related by the row search, not by name."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight_t = torch.nn.Parameter(linear.weight.detach().t().contiguous())
        self.bias = torch.nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight_t + self.bias


def _as_set(relations):
    return {(label, r.reference, r.kind, r.region) for label, found in relations.items()
            for r in found}


@pytest.fixture()
def pair(tiny, inputs):
    port = scratch.BertModel.from_hf(tiny)
    output = port.encoder.layer[1].output
    output.dense = TransposedLinear(output.dense)
    return tiny, port, inputs


def test_remembered_relations_are_the_ones_computed_afresh(pair):
    tiny, port, inputs = pair
    ref, cand = _views(tiny, port, inputs)
    fresh = _as_set(relate_weights(ref, cand))
    assert any(kind == "transposed" for _, _, kind, _ in fresh)
    with relations_remembered():
        first = _as_set(relate_weights(ref, cand))
        again = _as_set(relate_weights(*_views(tiny, port, inputs)))
    assert first == fresh and again == fresh


@pytest.mark.parametrize("edit", ["in place", "swapped"])
def test_a_weight_changed_since_is_read_again(pair, edit):
    tiny, port, inputs = pair
    dense = port.encoder.layer[1].output.dense
    with relations_remembered():
        before = _as_set(relate_weights(*_views(tiny, port, inputs)))
        label = "encoder.layer.1.output.dense.weight_t"
        assert (label, "encoder.layer.1.output.dense.weight", "transposed", None) in before
        # One value far from the rows and columns the row search hashes: only the check
        # of the whole matrix, remembered or not, sees it.
        edited = dense.weight_t.detach().clone()
        edited[300, 100] += 0.5
        if edit == "in place":  # the same tensor, a new version
            with torch.no_grad():
                dense.weight_t.copy_(edited)
        else:  # another tensor under the same name
            dense.weight_t = torch.nn.Parameter(edited)
        after = _as_set(relate_weights(*_views(tiny, port, inputs)))
    assert not any(found[0] == label and found[2] == "transposed" for found in after)
    assert after == _as_set(relate_weights(*_views(tiny, port, inputs)))


def test_nothing_is_remembered_outside_the_block(pair):
    tiny, port, inputs = pair
    with relations_remembered():
        relate_weights(*_views(tiny, port, inputs))
    from introspect.diff.ops.align import weights

    assert weights._REMEMBERED.get() is None


def test_a_dead_tensors_id_is_not_taken_for_a_new_one():
    from introspect.diff.ops.eager import _NodesByTensor

    graph = torch.fx.Graph()
    nodes = _NodesByTensor()
    first = torch.ones(3)
    nodes[first] = graph.placeholder("x")
    assert nodes.get(first) is not None
    born_at = id(first)
    del first
    gc.collect()
    for _ in range(1000):  # a new tensor where the dead one was, if the allocator obliges
        second = torch.zeros(3)
        if id(second) == born_at:
            break
    assert nodes.get(second) is None
    assert nodes.get(copy.copy(torch.ones(3))) is None
