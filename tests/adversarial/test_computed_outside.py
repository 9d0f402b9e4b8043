"""A value the recording is handed from outside it (``ops.outside``): a layer computed in
a worker thread, a LayerNorm in NumPy, in ports written as functions (no module of their
own to judge). The recording saw only what came back, as a constant, so the first op it
compared after it failed and was named: one layer late (probe round h). Such a value is
now paired as an op's is, and a fault computed there is named in its own layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import introspect
from introspect.diff.ops.outside import computed_outside
from tests.adversarial.corpus import port


class _Holder:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def test_only_a_value_nobody_holds_is_computed_outside():
    kept_in_a_dict = {"w": torch.ones(3)}
    kept_as_attribute = _Holder(torch.ones(3))
    closure_value = torch.ones(3)

    def reads():
        return closure_value

    constants = {"a": kept_in_a_dict["w"], "b": kept_as_attribute.tensor,
                 "c": reads(), "d": torch.from_numpy(np.ones(3, dtype=np.float32)),
                 "e": torch.ones(3) * 2}
    ours = [constants]
    assert computed_outside(constants, ours) == {"d", "e"}


def test_a_held_tensor_is_remembered_while_it_lives():
    """Found held once, not looked for again (a port's one-token steps pay one scan); its
    entry goes when it dies."""
    import gc

    from introspect.diff.ops import outside

    kept = {"w": torch.ones(3)}
    key = id(kept["w"])
    assert computed_outside({"a": kept["w"]}, []) == set()
    assert outside._held_before(kept["w"])
    del kept["w"]
    gc.collect()
    assert key not in outside._HELD


@pytest.fixture(scope="module")
def threaded():
    return port("thread_function.py")


def test_a_fault_in_a_threaded_layer_is_named_in_it(mini, threaded):
    reference, inputs = mini
    result = introspect.diff(reference.model, threaded.faulty(reference), inputs)
    assert not result.passed
    layer = f"encoder.layer.{threaded.threaded_layer(reference)}"
    divergence = result.first_divergence
    assert divergence.layer == layer, divergence
    assert any("where the recording does not reach" in h for h in divergence.hints)
    assert divergence.op == "LayerNorm"


def test_the_correct_threaded_port_passes(mini, threaded):
    reference, inputs = mini
    result = introspect.diff(reference.model, threaded.correct(reference), inputs)
    assert result.passed, result.first_divergence
    layer = threaded.threaded_layer(reference)
    rows = result.nodes.query(f"layer == 'encoder.layer.{layer + 1}' and matched_by == 'weights'")
    assert len(rows) >= 4  # (the next layer's projections, paired by their weights)


@pytest.mark.parametrize("nodes", [True, False])
def test_a_numpy_norm_slip_is_named_in_its_layer(mini, nodes):
    """With no node tables too: the whole models' float64 run fails first there, and its
    row, naming no call, does not overrule the op the recording names."""
    reference, inputs = mini
    ports = port("numpy_island.py")
    result = introspect.diff(reference.model, ports.faulty_alone(reference), inputs,
                             nodes=nodes)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == f"encoder.layer.{ports.slip_layer(reference)}", divergence
    assert divergence.module.endswith("attention.output.LayerNorm"), divergence
