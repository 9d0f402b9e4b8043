"""``--backward`` on ports that train one weight otherwise than the reference, their
forward bit for bit the same (``ports/untrained_weights.py``, probe round m). A weight
read through ``.detach()``, or with half its gradient, FAILED without node tables and
PASSED with them (the recorded backward pairs weights by the nodes reading them, and a
detached weight is read by none; the user's own backward now holds a recorded PASS). A
weight held in a buffer, or frozen, PASSED either way: no gradient of it was compared
(``backward.untrained``)."""

from __future__ import annotations

import pytest

import introspect
from tests.adversarial.corpus import port

FAULTY = {
    "weight_as_buffer": "a buffer, not a Parameter",
    "frozen_weight": "a parameter with requires_grad off",
    "weight_detached": "exactly zero in the candidate",
    "half_gradient": "times 0.5",
}


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("build", ["correct", *FAULTY])
def test_a_weight_trained_otherwise_fails_the_backward(tiny, build, nodes):
    reference, inputs = tiny
    model = getattr(port("untrained_weights.py"), build)(reference)
    result = introspect.diff(reference.model, model, inputs, backward=True, nodes=nodes)
    if build == "correct":
        assert result.passed, result.summary()
        return
    assert not result.passed and result.backward is not None
    assert not result.backward.passed
    divergence = result.backward.first_divergence
    assert divergence.parameter == "encoder.layer.1.intermediate.dense.weight", divergence
    assert divergence.layer == "encoder.layer.1", divergence
    assert any(FAULTY[build] in h for h in divergence.hints), divergence.hints
    # the recorded backward compared no gradient of a weight no recorded op reads with
    # one: it agreeing says nothing of calls (probe round n: "its backward changes from
    # call to call", of a port whose backward is the same every call)
    assert not any("its backward changes from call to call" in n
                   for n in result.backward.notes), \
        result.backward.notes
