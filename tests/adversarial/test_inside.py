"""A FAIL that module evidence proves, explained inside its failing module alone (issue
41, part 6: record and replay only inside a module whose evidence fails). With
``nodes=False`` neither model is recorded whole; the first divergence, its op and its
hints are the full recording's. Ports: ``ports/fused_encoder.py`` (fused q/k/v, einsum,
a hand-written LayerNorm; imports only torch); reference: bert-tiny with perturbed norms
and biases."""

from __future__ import annotations

import importlib

import pytest

from introspect.cli.main import main
from tests.adversarial.corpus import PORTS, port

INSIDE = "op-level evidence only inside"
op_level_steps = importlib.import_module("introspect.diff.flow.op_level")


def _diff(tiny, name, nodes):
    import introspect

    reference, inputs = tiny
    builder = getattr(port("fused_encoder.py"), name)
    return introspect.diff(reference.model, builder(reference), inputs, nodes=nodes)


@pytest.fixture
def whole_recordings(monkeypatch):
    """How many times the full path explained (each model recorded whole)."""
    count = [0]
    explain = op_level_steps.explain

    def counted(*args, **kwargs):
        count[0] += 1
        return explain(*args, **kwargs)

    monkeypatch.setattr(op_level_steps, "explain", counted)
    return count


@pytest.mark.parametrize("name, module, op", [
    ("faulty_tanh", "encoder.layer.1.intermediate.intermediate_act_fn", "GELUActivation"),
    ("faulty_scale", "encoder.layer.1.attention.self", "einsum"),
    ("faulty_eps", "encoder.layer.1.output.LayerNorm", "LayerNorm")])
def test_the_divergence_inside_is_the_full_recordings(tiny, whole_recordings, name, module,
                                                      op):
    inside = _diff(tiny, name, nodes=False)
    assert whole_recordings[0] == 0, "neither model recorded whole"
    assert any(n.startswith(INSIDE) for n in inside.notes)
    # no note on inputs the user never named (the holders' own, "args_0", "own_args_1")
    assert not any("args_" in n for n in inside.notes), inside.notes
    full = _diff(tiny, name, nodes=True)
    assert not inside.passed and not full.passed
    assert inside.inside.startswith("encoder.layer.1") and full.inside == ""
    assert f"inside {inside.inside} alone" in inside.summary().splitlines()[0]
    mine, theirs = inside.first_divergence, full.first_divergence
    assert (mine.module, mine.layer, mine.op, mine.hints, mine.candidate_module) == \
        (theirs.module, theirs.layer, theirs.op, theirs.hints, theirs.candidate_module)
    # the same node; its number counts the nodes of its kind in the module alone
    assert mine.reference_node.rstrip("_0123456789") == \
        theirs.reference_node.rstrip("_0123456789")
    assert (mine.module, mine.layer, mine.op) == (module, "encoder.layer.1", op)
    assert mine.hints, "the hypotheses ran on the whole models"
    # what was recorded: the failing module's nodes, not the model's
    assert len(inside.reference.records) * 4 < len(full.reference.records)
    paired = inside.nodes[inside.nodes["reference_node"] != ""]
    modules = {m for m in paired["module"] if m}
    assert modules and all(m.startswith("encoder.layer.1") for m in modules)
    # every layer module evidence judged still has its row
    assert {"embeddings", "encoder.layer.0", "encoder.layer.1"} <= set(inside.layers["layer"])


@pytest.mark.parametrize("name", ["correct", "correct_bias_fill"])
def test_correct_ports_pass(tiny, name):
    assert _diff(tiny, name, nodes=False).passed
    assert _diff(tiny, name, nodes=True).passed


def test_the_cli_names_the_op_and_its_cause(tiny_folder, capsys):
    code = main(["diff", "--model", str(tiny_folder), "--candidate",
                 f"{PORTS / 'fused_encoder.py'}:faulty_tanh"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "encoder.layer.1" in out and "tanh approximation of GELU" in out
    # the layers recorded only inside their failing module: their outputs were not
    # measured, and the table says nothing there rather than "nan"
    layers = out.split("\nlayers\n", 1)[1].split("\n\n", 1)[0]
    assert INSIDE in out and "nan" not in layers, layers


@pytest.mark.parametrize("name", ["compiled", "numpy", "thread", "vmap", "custom_op"])
def test_a_fault_the_recording_cannot_see_fails_as_with_node_tables(tiny, name):
    """Where the failing module holds what a recording cannot see (compiled code, NumPy,
    a thread), the full path runs; either way the verdict and layer are node tables'."""
    import introspect

    reference, inputs = tiny
    builder = getattr(port("modules_evidence.py"), f"faulty_{name}")
    results = []
    for nodes in (False, True):
        import torch

        torch._dynamo.reset()
        results.append(introspect.diff(reference.model, builder(reference), inputs,
                                       nodes=nodes))
    quick, full = results
    assert not quick.passed and not full.passed
    assert quick.first_divergence.layer == full.first_divergence.layer == "encoder.layer.1"


def test_a_compiled_model_fails_as_with_node_tables(tiny, whole_recordings):
    """The whole candidate compiled (a region the recording cannot see holding every
    module): the full path runs, and names the layer node tables name."""
    import torch

    import introspect

    reference, inputs = tiny
    results = []
    for nodes in (False, True):
        torch._dynamo.reset()
        model = torch.compile(port("fused_encoder.py").faulty_tanh(reference), backend="eager")
        results.append(introspect.diff(reference.model, model, inputs, nodes=nodes))
    quick, full = results
    assert not quick.passed and not full.passed
    assert quick.first_divergence.layer == full.first_divergence.layer == "encoder.layer.1"
    assert not quick.inside
