"""A Llama whose RMSNorm gains are folded into the Linears reading them
(``tests/ports/llama_folded_norms.py``), as quantization and rotation tools rewrite one.

Its q/k/v and gate/up hold none of HF's weights as they are, so the op-level alignment
cannot pair it, and each layer's module (paired by its ``o`` and ``down``, the reference's
own) computes a value of the reference's layer output only where it is right: module
evidence paired a module's output only with a reference value near it, or by weights
that all relate. A FAIL then named only ``outputs``. Where the outputs fail already, a
module some of whose weights are the reference's is paired with their owner's output
(``modules.pairing.pair_call``'s ``naming``): the FAIL names the layer. A PASS still
stands on proven pairs alone (the correct port passes).
"""

from __future__ import annotations

import pytest

import introspect
from tests.fixtures.families import grouped_llama, tiny_inputs
from tests.ports import llama_folded_norms


def test_the_folded_llama_passes():
    reference = grouped_llama()
    result = introspect.diff(reference, llama_folded_norms.build(reference),
                             tiny_inputs("llama"))
    assert result.passed, result.summary()


@pytest.mark.parametrize("fault", ["gelu", "eps"])
@pytest.mark.parametrize("layer", [1, 3])
@pytest.mark.parametrize("nodes", [False, True])
def test_a_fault_in_a_folded_layer_names_it(fault, layer, nodes):
    reference = grouped_llama()
    result = introspect.diff(reference, llama_folded_norms.build(reference, fault, layer),
                             tiny_inputs("llama"), nodes=nodes)
    assert not result.passed
    assert (result.outputs["status"] == "fail").any()
    divergence = result.first_divergence
    assert divergence.layer == f"layers.{layer}", divergence
    assert divergence.candidate_module == f"blocks.{layer}", divergence


@pytest.mark.parametrize("nodes", [False, True])
def test_the_folded_llama_backward(nodes):
    """Its weights are another parametrization: the folded Linears' gradients and the
    norms' are not the reference's, and are not compared (they failed it); a gradient cut
    in its MLP still fails, in its layer."""
    reference = grouped_llama()
    passed = introspect.diff(reference, llama_folded_norms.build(reference),
                             tiny_inputs("llama"), backward=True, nodes=nodes)
    assert passed.passed and passed.backward.passed, passed.summary()
    kinds = set(passed.backward.parameters["relation"]) if nodes else set()
    assert "folded" not in kinds
    cut = introspect.diff(reference, llama_folded_norms.build(reference, "detach", 2),
                          tiny_inputs("llama"), backward=True, nodes=nodes)
    assert cut.outputs is not None and (cut.outputs["status"] == "ok").all()
    assert not cut.passed and not cut.backward.passed
    assert cut.backward.first_divergence.layer == "layers.2", cut.backward.first_divergence
