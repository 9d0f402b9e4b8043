"""A forward that edits its own weights (``weight.data *= 1.001`` per call) fails, and is
named as such: not as dropout, not as a weight left unloaded (issue 30)."""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.run.truth import edited_weights, weight_sums
from tests.conftest import make_batch
from tests.diff.weight_edit_port import Drifting


def test_a_forward_that_edits_its_weights_fails_and_is_named(tiny_models):
    hf = tiny_models("base").model
    result = introspect.diff(hf, Drifting(hf), make_batch(2, 8, padded=True))
    assert not result.passed
    said = " ".join(result.notes) + " ".join(result.first_divergence.hints
                                             if result.first_divergence else ())
    assert "forward edits its own weights (inner.encoder.layer.1.intermediate.dense.weight)" \
        in said
    assert "dropout is active" not in said and "left unloaded" not in said


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_checksum_sees_one_value_one_step_off_in_any_dtype(dtype):
    model = torch.nn.Linear(300, 5000).to(dtype)  # 1.5M values: more than one chunk
    before = weight_sums(model)
    assert weight_sums(model) == before  # reading changes nothing
    with torch.no_grad():
        flat = model.weight.data.view(-1)  # through .data: no version counter moves
        flat[1_234_567] = torch.nextafter(flat[1_234_567], torch.tensor(9.0, dtype=dtype))
    assert edited_weights(before, weight_sums(model)) == ["weight"]


def test_a_nan_weight_is_a_value_like_any_other():
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert edited_weights(weight_sums(model), weight_sums(model)) == []
