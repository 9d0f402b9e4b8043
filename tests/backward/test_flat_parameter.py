"""``--backward`` on a port whose weights are views of one flat Parameter
(``tests/backward/flat_port.py``): no candidate parameter holds a reference weight as it
is, so no weight's gradient is compared. A weight whose view is taken from ``.data`` gets
no gradient at all, and its node gradients agree: the diff PASSED it (probe round g). A
gradient verdict with no weight compared is refused now, as every other verdict resting on
what nobody compared."""

from __future__ import annotations

import pytest

import introspect
from introspect.errors import InputError
from tests.backward import flat_port
from tests.conftest import make_batch


@pytest.mark.parametrize("cut", [None, "encoder.layer.1.intermediate.dense.weight"])
def test_no_weight_compared_is_no_verdict_on_gradients(tiny_models, cut):
    hf = tiny_models("base").model
    port = flat_port.build(hf, cut)
    with pytest.raises(InputError, match="compared no weight's gradient"):
        introspect.diff(hf, port, make_batch(2, 8, padded=True), backward=True)


def test_its_forward_still_gets_a_verdict(tiny_models):
    hf = tiny_models("base").model
    result = introspect.diff(hf, flat_port.build(hf), make_batch(2, 8, padded=True),
                             nodes=False)
    assert result.passed, result.summary()
