"""A Llama with no submodules, each layer a reentrant checkpoint
(``tests/ports/llama_one_function.py``, ``checkpointed``), under ``--backward``."""

from __future__ import annotations

import pytest

import introspect
from tests.fixtures.families import grouped_llama, tiny_inputs
from tests.ports import llama_one_function


@pytest.mark.parametrize("nodes", [False, True])
def test_reentrant_checkpoints_in_a_deep_stack_pass_the_backward(nodes):
    """Each layer a reentrant checkpoint: the backward runs the last layer's region first,
    and its values made again are matched to the forward's from that region's own start
    (``backward.record``): they were searched for from the first region's, past the reach
    of the search after two layers, and a gradient never hooked read as zero (a FAIL of
    0.1 at a residual add)."""
    reference = grouped_llama()
    result = introspect.diff(reference, llama_one_function.build(reference, checkpointed=True),
                             tiny_inputs("llama"), backward=True, nodes=nodes)
    assert result.passed and result.backward.passed, result.summary()
