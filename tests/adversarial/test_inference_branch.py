"""A layer that branches on ``torch.is_inference_mode_enabled()``
(``ports/inference_branch.py``).

The faulty twin's outputs under inference mode moved by 5e-5, under their budget, and no
other evidence ran there: the capture keeps the calls with autograd on and under
``no_grad``, and the recording takes neither branch. It PASSED. Now, where the candidate's
outputs under inference mode are not its ``no_grad`` call's bit for bit, the smallest
module that changes there (or its nearest judged ancestor) is judged again under
inference mode on the reference's inputs, against its own budget
(``modules.inference``).
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


@pytest.mark.parametrize("nodes", [False, True])
def test_a_branch_taken_under_inference_mode_only_is_judged(tiny, nodes):
    import introspect

    reference, inputs = tiny
    ports = port("inference_branch.py")
    passed = introspect.diff(reference.model, ports.correct(reference), inputs, nodes=nodes)
    assert passed.passed, passed.summary()
    failed = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=nodes)
    assert not failed.passed
    assert (failed.outputs["status"] == "ok").all()  # under the outputs' budget
    divergence = failed.first_divergence
    assert divergence.layer == "encoder.layer.1", divergence
    rows = failed.modules[failed.modules["call"] == "inference_mode"]
    assert list(rows["status"]) == ["fail"], failed.modules
