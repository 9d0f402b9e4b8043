"""Ports a probe of new hands found judged wrong.

- A GELU applied by a forward hook on the up-projection (the block's own activation the
  identity) FAILED, correct as it is: module evidence held the Linear's output, which the
  diff's global hook sees before the module's own hook, to the Linear run again with its
  hook, which returned the GELU (max abs error 3.83). A module run again then left its own
  forward hooks out, as its output was taken. Since probe round g a module with hooks of
  its own is taken by a hook of ours registered after theirs (what it returned), and run
  again with them.
- A hook scaling a layer's output by 1 + 1e-4 was blamed on the next layer (its first
  module took the scaled value from no judged module); it fails in its own layer.
- A layer mapped over rows with ``vmap`` and a fault in it got exit 2 ("Cannot access
  storage of BatchedTensorImpl"): the search for where the plain and recorded paths part
  compared values that have no storage. It now fails.
"""

from __future__ import annotations

import pytest

from introspect.cli.main import main
from tests.adversarial.corpus import PORTS, port


@pytest.mark.parametrize("nodes", [False, True])
def test_a_gelu_applied_by_a_hook_passes(tiny, nodes):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("hook_computes.py").correct(reference),
                             inputs, nodes=nodes)
    assert result.passed, result.summary()


def test_its_faulty_twin_fails_in_the_reference_layer(tiny):
    import introspect

    reference, inputs = tiny
    result = introspect.diff(reference.model, port("hook_computes.py").faulty(reference),
                             inputs, nodes=False)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence


@pytest.mark.parametrize("builder, code", [("correct", 0), ("faulty", 1)])
def test_a_layer_mapped_over_rows_gets_a_verdict(tiny_folder, capsys, builder, code):
    got = main(["diff", "--model", str(tiny_folder), "--candidate",
                f"{PORTS / 'vmap_rows.py'}:{builder}"])
    out, err = capsys.readouterr()
    assert got == code, out + err
    assert "Traceback" not in out + err
    # its recording is handed what vmap computed: it cannot say the port never reads the
    # mask, which the rows' layer reads (probe round n: a false note)
    assert "reads the values of" not in out, out


@pytest.fixture(scope="module")
def perturbed_mini():
    """MiniLM (six layers, real weights) of its own, its norms and biases perturbed."""
    from introspect.models.load import load_model, tokenize
    from tests.adversarial.corpus import as_reference, perturb

    loaded = load_model("minilm", head="base")
    perturb(loaded.model)
    return as_reference(loaded), tokenize(loaded.tokenizer)


@pytest.mark.parametrize("model", ["tiny", "perturbed_mini"])
def test_a_numpy_layernorm_far_off_fails_at_itself(model, request):
    """Its output is near no reference value, so module evidence paired it with nothing:
    bert-tiny's FAIL named only the outputs, MiniLM's the next op the recording saw, a
    layer later. Its weights prove its pair (the reference's LayerNorm), and a failing
    module before the recording's node names the divergence."""
    import introspect

    reference, inputs = request.getfixturevalue(model)
    numpy_norm = port("numpy_norm.py")
    assert introspect.diff(reference.model, numpy_norm.correct(reference), inputs).passed
    result = introspect.diff(reference.model, numpy_norm.faulty(reference), inputs)
    assert not result.passed
    assert result.first_divergence.module == "encoder.layer.1.output.LayerNorm", \
        result.first_divergence


@pytest.mark.parametrize("nodes", [False, True])
def test_a_layer_module_called_under_vmap_is_judged_as_one_call(tiny, nodes):
    """The model maps the layer module itself over the rows: module evidence kept the
    whole batch's values of that call (``capture.unbatch_call``) and runs it alone under
    ``vmap`` again on the reference's; it was left to its caller, and the FAIL named only
    the outputs."""
    import introspect

    reference, inputs = tiny
    ports = port("vmap_rows.py")
    passed = introspect.diff(reference.model, ports.correct_called(reference), inputs,
                             nodes=nodes)
    assert passed.passed, passed.summary()
    failed = introspect.diff(reference.model, ports.faulty_called(reference), inputs,
                             nodes=nodes)
    assert not failed.passed
    assert failed.first_divergence.layer == "encoder.layer.1", failed.first_divergence


@pytest.mark.parametrize("factor", [1.0 + 1e-4, 1.0])
def test_a_hook_scaling_a_layers_output_is_blamed_on_that_layer(mini, factor):
    """On MiniLM (the fault in layer 3 of 6): the hook's edit is what layer 3 returned."""
    import copy

    import introspect

    reference, inputs = mini
    port = copy.deepcopy(reference.model).eval()

    def scale(module, args, output):
        return (output[0] * factor, *output[1:]) if isinstance(output, tuple) \
            else output * factor

    port.encoder.layer[3].register_forward_hook(scale)
    result = introspect.diff(reference.model, port, inputs, nodes=False)
    if factor == 1.0:
        assert result.passed, result.summary()
        return
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.3", result.first_divergence

