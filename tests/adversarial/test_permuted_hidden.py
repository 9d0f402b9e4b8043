"""A port whose hidden dimension is permuted throughout (``ports/permuted_hidden.py``,
probe round i): nothing of it pairs with the reference but its outputs, so a FAIL is named
where the two float64 runs part (``modules.departure``). Every layer's values are the
reference's in another order of their features, so the runs part at the embeddings, and a
fault in layer 3 was named there. Where the first layer agrees once each row's features
are sorted, the layers are measured so, and the layer the fault is in is named; a fault in
the embeddings themselves stays named there."""

from __future__ import annotations

import pytest

import introspect
from tests.adversarial.corpus import as_reference, port


@pytest.mark.parametrize("build, layer", [
    ("correct", None), ("ln2_of_layer_3_unpermuted", "encoder.layer.3"),
    ("embedding_norm_unpermuted", "embeddings")])
def test_a_permuted_port_is_named_where_its_order_no_longer_holds(minilm, build, layer):
    model = getattr(port("permuted_hidden.py"), build)(as_reference(minilm))
    result = introspect.diff(minilm.model, model, introspect.tokenize(minilm.tokenizer),
                             nodes=False)
    if layer is None:
        assert result.passed, result.summary()
        return
    assert not result.passed
    assert result.first_divergence.layer == layer, result.first_divergence
    sorted_hint = any("each row's features sorted" in h for h in result.first_divergence.hints)
    assert sorted_hint == (layer != "embeddings"), result.first_divergence.hints
