"""Linears whose bias is not added onto their product (``ports/bias_elsewhere.py``).

The product ``x @ W.T`` is proven the reference's Linear by its weight, but holds no bias:
compared with the Linear's output it was off by the whole bias (0.47 on bert-tiny) and
correct ports FAILED. Where the bias was added after the residual (``(a @ W.T + x) + b``)
the add was taken for the Linear's "complete" output and was off by the residual (5.2).
Now a product that reads none of the Linear's bias, while the candidate holds that bias
elsewhere, is compared with the reference's output less the bias, and only an add that
takes the product itself completes it.
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


def _diff(tiny, builder):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("bias_elsewhere.py"), builder)(reference)
    return introspect.diff(reference.model, candidate, inputs, nodes=True)


@pytest.mark.parametrize("builder", ["before", "after", "per_head", "stacked"])
def test_the_correct_ports_pass_with_their_products_compared(tiny, builder):
    from introspect.diff.records import STATUS_OK

    result = _diff(tiny, builder)
    assert result.passed, result.summary()
    assert result.max_abs_err < 1e-4, result.summary()
    dense = [r for r in result.rows
             if r.reference_node == "encoder_layer_0_attention_output_dense"]
    assert dense and dense[0].status == STATUS_OK, dense
    assert "compared less encoder.layer.0.attention.output.dense.bias" in dense[0].note


@pytest.mark.parametrize("builder, module", [
    ("faulty", "encoder.layer.1.intermediate"),
    ("faulty_no_bias", "encoder.layer.1.attention.output"),
])
def test_a_fault_fails_in_its_layer(tiny, builder, module):
    result = _diff(tiny, builder)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == "encoder.layer.1", divergence
    assert divergence.module.startswith(module), divergence
