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
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


def test_the_folded_port_pairs_and_passes(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("folded_norms.py").correct(reference),
                             inputs)
    assert result.passed, result.summary()
    assert any("a norm's gain folded in" in note for note in result.nodes["note"]), \
        result.nodes["note"].unique()


@pytest.mark.parametrize("nodes", [False, True])
def test_a_slip_under_the_outputs_budget_fails_in_its_layer(tiny, nodes):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("folded_norms.py").faulty(reference),
                             inputs, nodes=nodes)
    assert not result.passed, result.summary()
    assert set(result.outputs["status"]) == {"ok", "unmatched"}, result.outputs
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence
