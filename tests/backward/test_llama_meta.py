"""``backward=True`` on a Llama written the way Meta's code is (``tests/ports/llama_meta.py``):
rotary embeddings on interleaved pairs, HF's q and k rows permuted to match.

Its backward FAILED while every weight's gradient agreed: the forward's replay found the
order of q's and k's features at run time and compared their values in it, but the
gradients were compared in the candidate's own order (0.02 off at the views of q), and a
pair whose own backward was over budget failed although the candidate's own gradient
agreed there. Now the orders the forward found are kept on the pairs, and such a pair is
unconfirmed, as in the forward.
"""

from __future__ import annotations

import pytest

import introspect
from tests.fixtures.families import grouped_llama, tiny_inputs
from tests.ports import llama_meta


def test_the_meta_style_llama_passes_forward_and_backward():
    reference = grouped_llama()
    result = introspect.diff(reference, llama_meta.build(reference), tiny_inputs("llama"),
                             backward=True, nodes=True)
    assert result.passed, result.summary()
    assert result.backward.passed and result.backward.first_divergence is None
    assert len(result.backward.parameter_rows) == 4 * 9 + 2


@pytest.mark.parametrize("fault", ["eps", "theta"])
def test_its_faulty_twin_fails_in_its_layer(fault):
    reference = grouped_llama()
    result = introspect.diff(reference, llama_meta.build(reference, fault, 1),
                             tiny_inputs("llama"), backward=True, nodes=True)
    assert not result.passed
    assert result.first_divergence.layer == "layers.1", result.first_divergence
