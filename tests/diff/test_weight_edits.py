"""A forward that edits its own weights (``weight.data *= 1.001`` per call) fails, and is
named as such: not as dropout, not as a weight left unloaded (issue 30)."""

from __future__ import annotations

import introspect
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
