"""Module evidence (issue 41 part 1): a fault the outputs' budget lets through, where the
op-level recording cannot see the plain call, fails in the reference's layer; its correct
twin passes. Ports: ``tests/adversarial/ports/modules_evidence.py`` (another hand's code:
imports nothing of ours). Reference: bert-tiny with perturbed norms and biases.

Each faulty port moves the outputs by less than their budget (``outputs_within_budget``:
on the code before module evidence, every one of them PASSED)."""

from __future__ import annotations

import pytest
import torch

from tests.adversarial.corpus import port

MECHANISMS = ["compiled", "compiling", "numpy", "grad", "thread", "vmap", "custom_op"]


def _diff(tiny, builder):
    import introspect

    reference, inputs = tiny
    torch._dynamo.reset()  # each compiled port compiles afresh (dynamo's recompile limit)
    return introspect.diff(reference.model, builder(reference), inputs)


@pytest.mark.parametrize("name", MECHANISMS)
def test_correct_twin_passes(name, tiny):
    result = _diff(tiny, getattr(port("modules_evidence.py"), f"correct_{name}"))
    assert result.passed, (result.first_divergence, result.notes)
    assert (result.modules["status"] != "fail").all()


@pytest.mark.parametrize("name", MECHANISMS)
def test_faulty_port_fails_in_the_reference_layer(name, tiny):
    result = _diff(tiny, getattr(port("modules_evidence.py"), f"faulty_{name}"))
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1"
    outputs = result.outputs
    assert (outputs["status"] == "ok").all(), "the fault must stay under the outputs' budget"


def test_module_divergence_names_both_sides(tiny):
    result = _diff(tiny, port("modules_evidence.py").faulty_compiled)
    d = result.first_divergence
    assert d.reference_node.startswith("encoder.layer.1")
    assert d.candidate_node == "blocks.1.ffn"
    assert "module evidence" in d.detail
    row = result.modules.query("candidate_module == 'blocks.1.ffn' and status == 'fail'")
    assert len(row) == 1 and row.iloc[0].max_abs_err > 3 * row.iloc[0].limit


def test_a_threaded_fault_is_named_at_the_value_handed_back(tiny):
    """The FFN's activation computed in a worker thread: the recording pairs what the
    thread hands back (``ops.outside``) and names the activation, its hint saying so;
    module evidence fails the threaded module too."""
    result = _diff(tiny, port("modules_evidence.py").faulty_thread)
    d = result.first_divergence
    assert d.module == "encoder.layer.1.intermediate.intermediate_act_fn", d
    assert any("where the recording does not reach" in h for h in d.hints), d
    row = result.modules.query("candidate_module == 'blocks.1.ffn.inner' and status == 'fail'")
    assert len(row) == 1 and row.iloc[0].max_abs_err > 3 * row.iloc[0].limit


@pytest.mark.parametrize("name, why", [("compiled", "compiled"), ("thread", "worker thread"),
                                       ("numpy", "outside autograd")])
def test_coverage_names_what_the_recording_could_not_see(name, why, tiny):
    result = _diff(tiny, getattr(port("modules_evidence.py"), f"correct_{name}"))
    coverage = result.coverage
    hit = coverage[coverage["why"].str.contains(why)]
    assert len(hit) and (hit["status"] == "ok").all()
    assert result.rests_on_modules


def test_values_edited_in_place_are_not_compared(tiny):
    """A Linear's output that the block then edits in place (``y += x``) no longer holds
    what the Linear returned: its call is left out, and the port passes."""
    result = _diff(tiny, port("modules_evidence.py").correct_inplace)
    assert result.passed
    rows = result.modules
    assert not rows["candidate_module"].isin(["blocks.0.proj", "blocks.1.ffn_out"]).any()
    assert rows["candidate_module"].isin(["blocks.1.norm2"]).any()


def test_values_edited_in_place_are_compared_as_returned_when_on_disk(tiny, monkeypatch):
    """On disk (``run.spill``), a value is the copy the hook took: what the Linear
    returned, before the block edits it. Its call is compared then, and the port passes."""
    monkeypatch.setenv("INTROSPECT_HOLD_MIB", "0")
    result = _diff(tiny, port("modules_evidence.py").correct_inplace)
    assert result.passed, (result.first_divergence, result.notes)
    rows = result.modules
    compared = rows[rows["candidate_module"].isin(["blocks.0.proj", "blocks.1.ffn_out"])]
    assert len(compared) and (compared["status"] == "ok").all()


def test_json_and_verdict_line_carry_module_evidence(tiny):
    import json

    from introspect.cli.diff_view import verdict_lines
    from introspect.report.json_report import json_report

    result = _diff(tiny, port("modules_evidence.py").correct_thread)
    data = json.loads(json_report(result))
    assert data["rests_on_modules"] is True
    assert any(row["why"] == "a worker thread" and row["status"] == "ok"
               for row in data["coverage"])
    assert any(row["candidate_module"] == "blocks.1.ffn.inner" for row in data["modules"])
    assert "module evidence covers" in verdict_lines(result)[0]


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class _ScriptedMlp(torch.nn.Module):
    """The same MLP written by hand; ``tanh``: a tanh GELU on its first unit only."""

    def __init__(self, reference: _Mlp, tanh: bool) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(reference.up.weight.detach().clone())
        self.b1 = torch.nn.Parameter(reference.up.bias.detach().clone())
        self.w2 = torch.nn.Parameter(reference.down.weight.detach().clone())
        self.b2 = torch.nn.Parameter(reference.down.bias.detach().clone())
        self.approximate = "tanh" if tanh else "none"

    def forward(self, x):
        h = x @ self.w1.t() + self.b1
        h = torch.cat([torch.nn.functional.gelu(h[..., :1], approximate=self.approximate),
                       torch.nn.functional.gelu(h[..., 1:])], -1)
        return h @ self.w2.t() + self.b2


@pytest.mark.parametrize("tanh", [False, True])
def test_a_whole_model_scripted_is_judged_by_its_own_call(tanh):
    """TorchScript all through, on floating inputs: the recording sees nothing inside and
    no submodule is hooked, so the model's own call is the only module evidence (its budget
    from its own noise, tighter than the outputs'): it must not be skipped as "the outputs"."""
    import introspect

    torch.manual_seed(0)
    reference = _Mlp().eval()
    inputs = {"x": torch.randn(2, 8, 16) * 0.3}
    candidate = torch.jit.script(_ScriptedMlp(reference, tanh).eval())
    result = introspect.diff(reference, candidate, inputs)
    assert (result.outputs["status"] == "ok").all(), "the fault must stay under the outputs' budget"
    assert result.passed is not tanh, result.summary()
    if tanh:
        assert result.first_divergence.candidate_module == ""
