"""A feed-forward in a ``torch.compile``d bound method (``ports/compiled_method.py``, probe
round h): the recording follows the user's call bit for bit, but its replay runs the
compiled region otherwise, so the node rows can be trusted for nothing. That replay used to
FAIL the correct port (no divergence named, only the note); the plain calls and module
evidence decide now, and the note says why the rows say nothing."""

from __future__ import annotations

import pytest
import torch

import introspect
from tests.adversarial.corpus import port


@pytest.mark.parametrize("nodes", [True, False])
def test_a_correct_port_with_a_compiled_method_passes(tiny, nodes):
    reference, inputs = tiny
    torch._dynamo.reset()
    result = introspect.diff(reference.model, port("compiled_method.py").correct(reference),
                             inputs, nodes=nodes)
    assert result.passed, (result.first_divergence, result.notes)
    assert any("replay computed other values than its recording" in n
               and "module evidence decide" in n for n in result.notes)
