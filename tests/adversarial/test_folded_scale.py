"""A port with the attention's 1/sqrt(d) folded into the query weights
(``ports/folded_scale.py``): a correct reparametrisation that FAILED on a guess.

Its query Linear holds no weight of the reference, so it is paired by structure, and its
output is the reference's over sqrt(d). Two things confirmed that guess: the views of the
query's output, which agreed with the reference's views locally and so counted as
"proven by value" (on bert-tiny, where every later value is exact), and the growth of the
error the nearest proven pairs carry across it (on MiniLM, where d = 32 and the folded
factor rounds: 0 before, 4e-6 after). Now a pair agreeing only locally proves nothing
after a guess, and a growth confirmation stands only where module evidence does not pass
the candidate's module that holds the guess (here the whole block, run on the
reference's inputs, agrees).
"""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import port


@pytest.fixture(scope="module")
def perturbed_mini():
    """MiniLM (six layers, real weights; d = 32), its norms and biases perturbed."""
    from introspect.models.load import load_model, tokenize
    from tests.adversarial.corpus import as_reference, perturb

    loaded = load_model("minilm", head="base")
    perturb(loaded.model)
    return as_reference(loaded), tokenize(loaded.tokenizer)


def _diff(reference, inputs, builder, nodes):
    import introspect

    candidate = getattr(port("folded_scale.py"), builder)(reference)
    return introspect.diff(reference.model, candidate, inputs, nodes=nodes)


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("model", ["tiny", "perturbed_mini"])
def test_the_folded_port_passes(model, nodes, request):
    from introspect.diff.records import STATUS_UNCONFIRMED

    reference, inputs = request.getfixturevalue(model)
    result = _diff(reference, inputs, "correct", nodes)
    assert result.passed, result.summary()
    query = [r for r in result.rows if r.reference_node.endswith("attention_self_query")]
    assert query and all(r.status == STATUS_UNCONFIRMED for r in query), query


@pytest.mark.parametrize("builder, module", [
    ("faulty", "encoder.layer.{}.intermediate"),
    ("faulty_scale", "encoder.layer.{}.attention"),
])
@pytest.mark.parametrize("model", ["tiny", "perturbed_mini"])
def test_a_fault_beside_the_fold_fails_in_its_layer(model, builder, module, request):
    reference, inputs = request.getfixturevalue(model)
    layer = port("adv_bert.py").fault_layer(reference)
    result = _diff(reference, inputs, builder, nodes=True)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.layer == f"encoder.layer.{layer}", divergence
    assert divergence.module.startswith(module.format(layer)), divergence
    if builder == "faulty_scale":  # the hint names the fold and how far off it is
        assert any("a scale folded into it" in h and "+0.01 off it" in h
                   for h in divergence.hints), divergence.hints


def test_a_scaled_copy_is_found_and_named():
    import math

    import torch

    from introspect.diff.hypotheses.weights import scale_between, scaled_hint

    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    assert scale_between(w * 0.125, w) == pytest.approx(0.125)
    assert scale_between(w.clone(), w) is None  # the same values: no fold
    assert scale_between(w * 0.125 + 1e-3 * torch.rand(8, 8), w) is None
    assert scale_between(torch.zeros(8, 8), w) is None
    exact = scaled_hint("q.weight", "blocks.1.q.weight", 1 / math.sqrt(32))
    assert "times 0.176777:" in exact and "off it" not in exact
    off = scaled_hint("q.weight", "blocks.1.q.weight", 1.01 / math.sqrt(64))
    assert "not 1/sqrt(64) = 0.125 (+0.01 off it)" in off
