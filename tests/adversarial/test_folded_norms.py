"""A BERT with every LayerNorm's gain and shift folded into the Linears that read it
(``ports/folded_norms.py``), as quantization and rotation tools rewrite models.

Its query, key, value and intermediate weights are the reference's with each column
scaled by a LayerNorm's gain, so nothing related them: the alignment paired no node
("shares weights with only ... weighted nodes") and module evidence no layer (each takes
the normalized stream), and a slip of one layer's attention scale, under the outputs'
budget on bert-tiny, PASSED. Now such a weight relates as "folded", by proof (the gain
read off it is one of the reference's vectors, and ``W * g`` is the candidate's within
float32's rounding: ``ops.align.weights.folds_between``); its Linear pairs with the
reference's, whose output it computes from the norm's output before its gain.

Written other ways (a probe round's ports): applied by ``einsum`` with the folded bias
added apart, the correct port FAILED (the product was held to the reference's Linear
output, bias and all, and the weightless norm's output paired with the reference's
LayerNorm output through the Linears' arguments); stored transposed, nothing paired.
Folded into one fused QKV Linear, nothing related it, and under ``--backward`` the norms'
gradients were held to the candidate's copies of their gains. Now a folded Linear's
arguments are its own, its product is compared with the reference's output less
``b + W @ shift`` where the candidate holds that bias, a weight stored transposed relates
as "folded transposed", and each block of rows of a fused one as "fused folded".
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


@pytest.mark.parametrize("form", ["", "_einsum", "_transposed", "_fused"])
def test_the_folded_port_pairs_and_passes(tiny, form):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("folded_norms.py"), "correct" + form)(reference)
    result = introspect.diff(reference.model, candidate, inputs)
    assert result.passed, result.summary()
    assert any("a norm's gain folded in" in note for note in result.nodes["note"]), \
        result.nodes["note"].unique()


@pytest.mark.parametrize("form", ["", "_einsum", "_transposed", "_fused"])
@pytest.mark.parametrize("nodes", [False, True])
def test_a_slip_under_the_outputs_budget_fails_in_its_layer(tiny, nodes, form):
    import introspect

    reference, inputs = tiny
    candidate = getattr(port("folded_norms.py"), "faulty" + form)(reference)
    result = introspect.diff(reference.model, candidate, inputs, nodes=nodes)
    assert not result.passed, result.summary()
    assert set(result.outputs["status"]) == {"ok", "unmatched"}, result.outputs
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence


def test_the_fused_folded_port_backward(tiny):
    import introspect

    reference, inputs = tiny
    candidate = port("folded_norms.py").correct_fused(reference)
    result = introspect.diff(reference.model, candidate, inputs, backward=True)
    assert result.passed and result.backward.passed, result.summary()
