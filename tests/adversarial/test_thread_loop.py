"""A layer loop run in a worker thread (``ports/thread_loop.py``, probe round o): the code
between two layers ran where the recording does not reach, and a layer's output scaled by
1 + 1e-4 there PASSED on the outputs' budget, each layer within its own (a port whose
weights the recording never saw: no node pairs). Module evidence now holds what the loop
hands the next layer to what the last returned, in the thread too (1 + 2e-5 here, under
the outputs' budget); the correct loop passes."""

from __future__ import annotations

import pytest

import introspect
from introspect.diff.records import STATUS_FAIL
from tests.adversarial.corpus import port


@pytest.mark.parametrize("build", ["correct", "faulty"])
def test_code_between_layers_in_a_worker_thread_is_judged(mini, build):
    reference, inputs = mini
    result = introspect.diff(reference.model, getattr(port("thread_loop.py"), build)(reference),
                             inputs, nodes=False)
    if build == "correct":
        assert result.passed, result.summary()
        return
    assert not result.passed, result.summary()
    assert (result.outputs["status"] == "ok").all()  # under the outputs' budget
    d = result.first_divergence
    assert d.layer == "encoder.layer.3", d
    assert any(row.status == STATUS_FAIL and row.note.startswith(
        "what code between modules hands on blocks.3 (args.0): it took what blocks.2 returned")
        for row in result.module_evidence.rows), result.module_evidence.rows

