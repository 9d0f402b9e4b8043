"""A difference the layer holding it cancels, where the layer is its only module (probe
round t, port 12, a fairseq-style port written as functions): its key computed without
its bias FAILED at the op-level key node (0.0031 over 1e-5), though every output and its
layer agree, because module evidence had no key module to run in float64
(``modules.cancelled``). Now the smallest passing module holding a failing node, run on
the reference's inputs in float64, is held to the reference's (``cancelling_holders``):
where it is the reference's to float64 rounding, and ran the same ops in float32 as in
float64 (``same_program``), the node is unconfirmed and the port passes, with a note.
The key scaled by 1 + 1e-5 fails (not cancelled in float64); so does a key right in
float64 only, by an op or a number picked by its dtype (without the same-program check
both passed), or computed in bfloat16; and a tanh GELU in layer 2 beside the cancelled
key is named there."""

from __future__ import annotations

import pytest

from tests.adversarial.corpus import diff_port, run_port

FILE = "functional_key_bias.py"


@pytest.mark.parametrize("nodes", [False, True])
def test_a_key_without_its_bias_in_a_layer_of_functions_passes(mini, nodes):
    result = diff_port(mini, FILE, "key_bias_left_out", nodes=nodes)
    assert result.passed, result.summary()
    note = [n for n in result.notes if "node(s) over budget inside layers.3" in n]
    assert note and "run on the reference's inputs in float64" in note[0], result.notes
    assert "running the same ops as in float32" in note[0]
    layers = result.layers.set_index("layer").status
    assert layers["encoder.layer.3"] == "unconfirmed", layers.to_dict()
    if nodes:
        key = result.nodes[result.nodes.reference_node == "encoder_layer_3_attention_self_key"]
        assert list(key.status) == ["unconfirmed"]
        assert not (result.nodes.status == "fail").any()


def test_the_correct_port_passes_with_nothing_unconfirmed(mini):
    result = diff_port(mini, FILE, "correct")
    assert result.passed
    assert not any("node(s) over budget inside" in n for n in result.notes)
    assert "unconfirmed" not in set(result.layers.status)


@pytest.mark.parametrize("nodes", [False, True])
@pytest.mark.parametrize("build", ["faulty_key_scaled", "faulty_key_extra_op_in_float32",
                                   "faulty_key_number_by_dtype", "faulty_key_in_bfloat16"])
def test_a_key_its_layer_does_not_cancel_as_run_fails_in_its_layer(mini, build, nodes):
    result = diff_port(mini, FILE, build, nodes=nodes)
    assert not result.passed
    first = result.first_divergence
    assert first.layer == "encoder.layer.3", first
    assert first.candidate_module == "layers.3", first
    assert not any("node(s) over budget inside" in n for n in result.notes)


def test_a_gelu_beside_a_cancelled_key_is_named_not_the_key(mini):
    result = diff_port(mini, FILE, "faulty_tanh_beside_key_bias_left_out")
    assert not result.passed
    first = result.first_divergence
    assert (first.layer, first.module) == (
        "encoder.layer.2", "encoder.layer.2.intermediate.intermediate_act_fn"), first
    assert any("tanh" in h for h in first.hints), first.hints


def test_the_cli_passes_the_port_and_says_why():
    done = run_port(FILE, "key_bias_left_out")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "parity holds" in done.stdout.splitlines()[0]
    assert "1 node(s) over budget inside layers.3" in done.stdout
