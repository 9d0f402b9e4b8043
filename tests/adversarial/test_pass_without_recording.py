"""A PASS for a few forwards (issue 41, part 6): with ``nodes=False`` a PASS that the
outputs and module evidence prove records and replays nothing; a FAIL a module proves is
explained inside that module (``test_inside.py``); anything else takes the full path, with
the same verdict as ``nodes=True``. Ports: ``ports/fast_pass.py`` (imports
nothing of ours); reference: bert-tiny with perturbed norms and biases."""

from __future__ import annotations

import importlib

import pytest

from tests.adversarial.corpus import port

# the steps of diff() that record the reference and explain (``introspect.diff.flow``)
reference_steps = importlib.import_module("introspect.diff.flow.reference")
op_level_steps = importlib.import_module("introspect.diff.flow.op_level")


@pytest.fixture
def recorded(monkeypatch):
    """How many times each model was recorded (``record_for_diff``) and explained."""
    counts = {"recordings": 0, "explanations": 0}
    record, explain = reference_steps.record_for_diff, op_level_steps.explain

    def counted_record(*args, **kwargs):
        counts["recordings"] += 1
        return record(*args, **kwargs)

    def counted_explain(*args, **kwargs):
        counts["explanations"] += 1
        return explain(*args, **kwargs)

    monkeypatch.setattr(reference_steps, "record_for_diff", counted_record)
    monkeypatch.setattr(op_level_steps, "explain", counted_explain)
    return counts


def _diff(tiny, name, nodes):
    import introspect

    reference, inputs = tiny
    builder = getattr(port("fast_pass.py"), name)
    return introspect.diff(reference.model, builder(reference), inputs, nodes=nodes)


def test_a_correct_port_passes_with_no_recording(tiny, recorded):
    result = _diff(tiny, "correct_plain", nodes=False)
    assert result.passed, result.notes
    assert recorded == {"recordings": 0, "explanations": 0}
    assert not result.op_level and result.rows == [] and result.reference is None
    assert any(n.startswith("no op-level recording") for n in result.notes)
    assert "no op-level recording" in result.summary().splitlines()[0]
    modules = result.modules
    assert len(modules) and (modules["status"] == "ok").all()
    assert {"embeddings", "encoder.layer.0", "encoder.layer.1"} <= set(result.layers["layer"])


def test_a_head_models_layers_are_the_full_tables_layers(tiny_models, recorded):
    # module rows were named by the module's path: "bert" (embeddings and pooler in one
    # row), "bert.encoder.layer.0" and "classifier", none of them a row of the full table
    import copy

    import introspect

    loaded = tiny_models("sequence-classification", "sdpa")
    inputs = introspect.tokenize(loaded.tokenizer)
    fast = introspect.diff(loaded.model, copy.deepcopy(loaded.model), inputs, nodes=False)
    assert fast.passed and recorded["recordings"] == 0
    assert set(fast.modules["layer"]) == set(fast.layers["layer"]) == {
        "embeddings", "encoder.layer.0", "encoder.layer.1", "pooler", "head"}
    full = introspect.diff(loaded.model, copy.deepcopy(loaded.model), inputs, nodes=True)
    assert set(fast.layers["layer"]) <= set(full.layers["layer"])


def test_the_printed_layer_table_leaves_what_was_not_measured_blank(tiny):
    # a layer's output error is not measured without a recording (NaN in the frame):
    # "nan" in an error column reads as NaN values in the model
    import io

    from introspect.cli.diff_view import print_diff

    result = _diff(tiny, "correct_plain", nodes=False)
    stream = io.StringIO()
    print_diff(result, stream, quiet=False, all_nodes=False, width=100)
    assert result.layers["max_abs_err"].isna().all()
    assert "nan" not in stream.getvalue() and "encoder.layer.1" in stream.getvalue()


def test_nodes_true_keeps_the_node_tables(tiny, recorded):
    result = _diff(tiny, "correct_plain", nodes=True)
    assert result.passed and result.op_level and len(result.nodes)
    assert recorded["explanations"] == 1


@pytest.mark.parametrize("name, path", [("faulty_ffn", "inside"), ("faulty_glue", "full")])
def test_a_fault_under_the_outputs_budget_is_explained(tiny, recorded, name, path):
    """A module over its budget is explained inside that module alone (``flow.inside``:
    neither model is recorded whole); glue no module judges, by the full path."""
    result = _diff(tiny, name, nodes=False)
    inside = any(n.startswith("op-level evidence only inside") for n in result.notes)
    assert (recorded["explanations"], inside) == ((0, True) if path == "inside" else (1, False))
    assert (result.outputs["status"] == "ok").all(), "the fault must stay under the outputs' budget"
    assert not result.passed
    assert result.first_divergence.layer in ("encoder.layer.1", "encoder.layer.0")
    full = _diff(tiny, name, nodes=True)
    assert (full.passed, full.first_divergence.layer) == \
        (result.passed, result.first_divergence.layer)


def test_the_ffn_fault_is_named_in_layer_1(tiny):
    result = _diff(tiny, "faulty_ffn", nodes=False)
    assert result.first_divergence.layer == "encoder.layer.1"
    assert result.op_level and len(result.nodes)


def test_glue_no_module_judges_takes_the_full_path_and_passes(tiny, recorded):
    result = _diff(tiny, "correct_bare", nodes=False)  # its pooler's tanh is glue
    assert result.passed and result.op_level and len(result.nodes)
    assert recorded["explanations"] == 1


def test_glue_equal_to_a_judged_value_needs_no_recording(tiny, recorded):
    """The correct twin of the glue port computes x * 1.0 between the blocks: a value no
    judged module returned, yet equal to one; it may pass without a recording, and its
    verdict is the full path's."""
    result = _diff(tiny, "correct_glue", nodes=False)
    assert result.passed and not result.op_level
    assert recorded["explanations"] == 0
    assert _diff(tiny, "correct_glue", nodes=True).passed


def test_a_weight_of_its_own_takes_the_full_path(tiny, recorded):
    """A Linear's weight shifted by a constant moves every unit of its output alike, and
    the LayerNorm after it takes that away: the module over both agrees with the
    reference, the outputs too. The weight relates to none of the reference's, so the
    full path runs; it pairs the Linear by its weights' names alone, a guess that the
    passing module overrules (``ops.divergence.on_a_guess``): the port passes. One row
    of the weight shifted is no shift the LayerNorm takes away: it fails there."""
    import copy

    import torch

    import introspect

    reference, inputs = tiny
    tuned = copy.deepcopy(reference.model)
    with torch.no_grad():
        tuned.encoder.layer[1].output.dense.weight.add_(0.01)
    result = introspect.diff(reference.model, tuned, inputs, nodes=False)
    assert recorded["explanations"] == 1
    assert result.passed, result.summary()
    with torch.no_grad():
        tuned.encoder.layer[1].output.dense.weight[1:].sub_(0.01)  # (row 0 alone shifted)
    result = introspect.diff(reference.model, tuned, inputs, nodes=False)
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence
