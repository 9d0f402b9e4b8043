"""Gradients kept uncopied, and a candidate's compared as autograd makes them.

``GradientSink`` keeps each node's gradient without a copy, and proves afterwards that
nothing changed it in place (a custom backward that edits its ``grad_output``): where
something did, the backward runs again, copying. The diff hands the candidate's gradients
to the comparison as they come and keeps none of them; its rows are those the stored
gradients give.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import introspect
from introspect.diff.backward.record import record_backward, run_forward
from introspect.models.load import tokenize
from introspect.run.reference import ReferenceChanged
from tests.backward import grad_output_ports, ports
from tests.backward.test_backward import perturbed

parity = importlib.import_module("introspect.diff.backward.parity")
measure = importlib.import_module("introspect.diff.backward.measure")
again = importlib.import_module("introspect.diff.backward.again")


class _EditsItsGradOutput(torch.autograd.Function):
    """y = 2x, whose backward doubles its grad_output in place and returns it."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _EditsItsGradOutput.calls += 1
        grad.mul_(2)  # in place: the gradient autograd gave the output's hook
        return grad


class _Edits(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = self.first(x)
        doubled = _EditsItsGradOutput.apply(h.tanh())
        return self.second(doubled * 3)


def _loss(outputs, inputs):
    return (outputs * torch.arange(3.0)).sum()


@pytest.mark.parametrize("keep_graph", [True, False])
def test_a_gradient_changed_in_place_after_its_hook_is_taken_as_made(keep_graph):
    """Changed: with the graph kept the backward runs again, copying; without it, the
    forward and the backward."""
    torch.manual_seed(0)
    model = _Edits()
    inputs = {"x": torch.randn(2, 4)}
    copied = run_forward(model, inputs).backward(_loss, copy=True)  # a copy at each hook
    _EditsItsGradOutput.calls = 0
    kept = record_backward(model, inputs, _loss, keep_graph=keep_graph)  # uncopied, checked
    assert _EditsItsGradOutput.calls == 2
    assert copied.grads.keys() == kept.grads.keys()
    for name, grad in copied.grads.items():
        assert torch.equal(grad, kept.grads[name]), name
    for name, grad in copied.parameter_grads.items():
        assert torch.equal(grad, kept.parameter_grads[name]), name


def test_a_backward_that_lets_the_values_go_keeps_their_shells():
    torch.manual_seed(0)
    model = _Edits()
    inputs = {"x": torch.randn(2, 4)}
    full = record_backward(model, inputs, _loss)
    lean = run_forward(model, inputs).backward(_loss, keep_values=False)
    assert lean.values == {} and lean.tensors == {} and lean.edges == {}
    assert lean.shells == full.shells and set(lean.shells) == set(full.values)
    assert all(lean.shells[n].shape == v.shape and lean.shells[n].dtype == v.dtype
               for n, v in full.values.items())
    for name, grad in full.grads.items():
        assert torch.equal(grad, lean.grads[name]), name


def test_the_reference_run_again_must_compute_what_it_did():
    """The local backwards run the reference's forward again, after the candidate was
    built: a reference that computes otherwise then is no reference (exit 2)."""
    class Drifts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.linear(x) * (1.0 if self.calls == 1 else 1.5)

    torch.manual_seed(0)
    model = Drifts()
    inputs = {"x": torch.randn(2, 4)}
    first = run_forward(model, inputs).backward(_loss, keep_values=False)
    with pytest.raises(ReferenceChanged, match="changed what the reference computes"):
        again.reference_again(model, inputs, first)
    steady = _Edits()
    first = run_forward(steady, inputs).backward(_loss, keep_values=False)
    made = again.reference_again(steady, inputs, first)
    assert made.values.keys() == first.shells.keys() and made.edges and made.grads is first.grads


def test_gradients_no_backward_edits_are_kept_uncopied_and_run_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    inputs = {"input": torch.randn(2, 4)}
    copied = record_backward(model, inputs, _loss, keep_graph=False)
    kept = record_backward(model, inputs, _loss)
    for name, grad in copied.grads.items():
        assert torch.equal(grad, kept.grads[name]), name


def test_a_consumer_gets_every_gradient_once_and_none_is_kept():
    torch.manual_seed(0)
    model = _Edits()
    inputs = {"x": torch.randn(2, 4)}
    stored = record_backward(model, inputs, _loss, keep_graph=False)
    seen: dict[str, torch.Tensor] = {}

    def consume(name, grad):
        assert name not in seen
        seen[name] = grad.clone()

    recording = run_forward(model, inputs).backward(_loss, consumer=consume)
    assert recording.grads == {}
    assert seen.keys() == stored.grads.keys()
    for name, grad in stored.grads.items():  # as made: before the backward edits it
        assert torch.equal(grad, seen[name]), name


def test_a_port_not_the_same_when_run_again_has_no_local_backward_and_fails():
    reference = grad_output_ports.Reference()
    port = grad_output_ports.build(reference, "term_then_drifts")
    inputs = {"x": torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))}
    result = introspect.diff(reference, port, inputs, backward=True,
                             loss=grad_output_ports.loss)
    assert not result.backward.passed and not result.passed
    assert any("run again for the local backwards of its gradients, computed otherwise" in n
               for n in result.backward.notes), result.summary()
    # four plain calls, the recorded one and the one run again for the local backwards;
    # module evidence runs the model no more (its only module is the model's own call,
    # which took the reference's inputs bit for bit and is within its rounding floor:
    # no run on inputs rounded once more, ``modules.local``); the recorded FAIL then takes
    # each side's own backward, three plain calls, to name where the gradients handed to
    # the modules' outputs part (``flow.gradients``: node tables were asked for, so the
    # first calls took none)
    assert port.calls == 9
    assert result.first_divergence.phase == "backward"  # not the noise run's drift


@pytest.fixture(scope="module")
def mlm():
    return perturbed("masked-lm")


def test_rows_compared_as_they_come_are_the_stored_gradients_rows(mlm):
    """The diff's streamed rows against the rows of both sides' stored gradients, for a
    port whose GELU backward is wrong (rows that drift and fail, hints and all)."""
    hf, tokenizer = mlm
    port = ports.build(hf, bug="custom_gelu", layer=1)
    inputs = dict(tokenize(tokenizer).tensors)
    result = introspect.diff(hf, port, inputs, backward=True)
    assert not result.backward.passed
    stored = parity.backward_diff(hf, port, inputs, inputs, result.alignment, result.reference,
                                  result.candidate, result.tolerance,
                                  attention_mask=inputs["attention_mask"])
    assert [r for r in result.backward.rows if r.status != "ok"]
    assert result.backward.rows == stored.rows
    assert result.backward.parameter_rows == stored.parameter_rows
    assert result.backward.first_divergence == stored.first_divergence


def test_the_sgd_step_measured_a_slice_at_a_time_is_the_whole_steps_error():
    generator = torch.Generator().manual_seed(0)
    shape = (3, parity._STEP_CHUNK // 2 + 7)  # three slices, the last one short
    w_ref, g_ref, g_cand = (torch.randn(shape, generator=generator) for _ in range(3))
    w_cand = w_ref.t().contiguous().t()  # the same values, another layout
    w_cand[2, 5] += 1e-3
    whole = ((w_cand.double() - parity.SGD_LR * g_cand.double())
             - (w_ref.double() - parity.SGD_LR * g_ref.double())).abs().max()
    assert parity._sgd_step_error(w_ref, g_ref, w_cand, g_cand) == float(whole)
    g_cand[1, 3] = float("nan")
    assert parity._sgd_step_error(w_ref, g_ref, w_cand, g_cand) != \
        parity._sgd_step_error(w_ref, g_ref, w_cand, g_cand)  # NaN, as one max says


def test_a_consumers_own_error_is_raised_as_it_is_not_blamed_on_the_model():
    torch.manual_seed(0)
    model = _Edits()

    def broken(name, grad):
        raise KeyError("the comparison's own bug")

    with pytest.raises(KeyError, match="comparison's own bug"):
        run_forward(model, {"x": torch.randn(2, 4)}).backward(_loss, consumer=broken)


@pytest.mark.parametrize("edits", [False, True], ids=["plain-reference", "editing-reference"])
@pytest.mark.parametrize("fault", [None, "term", "hook"])
def test_ports_whose_backward_edits_grad_output_in_place(edits, fault):
    """A port in another hand whose GELU backward scales its grad_output in place passes;
    one that forgets a term, or whose hook edits a handed-out gradient, fails; the same
    against a reference whose own backward edits in place."""
    reference = grad_output_ports.Reference(edits=edits)
    port = grad_output_ports.build(reference, fault)
    inputs = {"x": torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))}
    result = introspect.diff(reference, port, inputs, backward=True,
                             loss=grad_output_ports.loss)
    assert result.backward is not None
    assert result.backward.passed is (fault is None), result.summary()
    assert result.passed is (fault is None), result.summary()
    if fault is None:  # every node's gradient as autograd made it, on both sides
        assert [r.status for r in result.backward.rows] == ["ok"] * len(result.backward.rows)


@pytest.fixture(scope="module")
def base():
    return perturbed("base")


@pytest.mark.parametrize("port, fault, passes, expected", [
    ("scratch", None, True, []),  # every pair of one shape, all within budget: none
    ("seq_first", None, True, ["reference"]),  # (S, B, H): a layout fitted on both values
    ("nanogpt_style", None, True, ["reference"]),  # fused q, k, v: regions
    ("nanogpt_style", "gelu_tanh", False, ["reference", "candidate"]),  # local backwards
])
def test_a_forward_runs_again_only_for_a_layout_or_a_local_backward(
        base, monkeypatch, port, fault, passes, expected):
    import introspect.scratch as scratch
    from tests.ports import nanogpt_style, seq_first
    from tests.ports.batch import port_batch

    hf, tokenizer = base
    builders = {"scratch": lambda: scratch.BertModel.from_hf(hf),
                "seq_first": lambda: seq_first.build(hf),
                "nanogpt_style": lambda: nanogpt_style.build(hf, fault)}
    runs = []
    real = again.run_again

    def counted(model, *args):
        runs.append("reference" if model is hf else "candidate")
        return real(model, *args)

    monkeypatch.setattr(again, "run_again", counted)  # the reference's (``reference_again``)
    monkeypatch.setattr(parity, "run_again", counted)  # the candidate's: parity imports it
    result = introspect.diff(hf, builders[port](), port_batch(tokenizer), backward=True)
    assert result.backward.passed is passes, result.summary()
    assert runs == expected
    assert "not compared" not in {r.status for r in result.backward.rows}
    if not passes:
        assert result.backward.first_divergence.reference_node == \
            "encoder_layer_0_intermediate_intermediate_act_fn"


@pytest.mark.parametrize("case", ["close", "over", "inf", "nan", "same"])
@pytest.mark.parametrize("allow_nonfinite", [False, True])
def test_a_large_gradient_measured_a_slice_at_a_time_as_whole(case, allow_nonfinite):
    """What ``_errors`` says of a gradient past one slice is what it says of it whole."""
    from introspect.diff.tolerance import Budget

    generator = torch.Generator().manual_seed(0)
    ref = torch.randn(measure._SLICE + 1000, generator=generator)
    cand = ref.clone() if case == "same" else \
        ref + torch.randn(ref.shape, generator=generator) * 1e-7
    if case == "over":
        cand[measure._SLICE + 10] += 1.0
    if case in ("inf", "nan"):
        ref[5] = cand[measure._SLICE + 3] = float(case)
    budget = Budget(1e-5, 1e-5)
    sliced = measure._errors(cand, ref, budget, allow_nonfinite=allow_nonfinite)
    saved_slice, measure._SLICE = measure._SLICE, 1 << 40  # the whole tensor in one pass
    try:
        whole = measure._errors(cand, ref, budget, allow_nonfinite=allow_nonfinite)
    finally:
        measure._SLICE = saved_slice
    assert str(sliced) == str(whole)  # NaN equal to NaN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_gradients_magnitude_without_a_copy_is_abs_max(dtype):
    generator = torch.Generator().manual_seed(0)
    cases = [torch.randn(7, 5, generator=generator).to(dtype), -torch.ones(3, dtype=dtype),
             torch.tensor([0.0, -0.0], dtype=dtype),
             torch.tensor([1.0, float("-inf")], dtype=dtype),
             torch.tensor([float("nan"), 2.0], dtype=dtype), torch.zeros(0, 4, dtype=dtype)]
    for tensor in cases:
        expected = float(tensor.abs().max()) if tensor.numel() else 0.0
        assert str(measure.magnitude_of(tensor)) == str(expected), tensor


def test_a_forward_run_again_from_its_random_state_draws_the_same_numbers():
    """Dropout left on: the run again for the local backwards makes the same masks, and
    the caller's generators are as they were."""
    import random

    from introspect.run.random_state import RandomState, random_state_of

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, training=True) + random.random()

    model, x = Noisy(), torch.ones(64)
    state = RandomState.now()
    first = model(x)
    torch.manual_seed(123)
    random.seed(5)
    caller = (torch.rand(4), random.random())
    torch.manual_seed(123)
    random.seed(5)
    with random_state_of(state):
        again = model(x)
    assert torch.equal(first, again)
    assert torch.equal(torch.rand(4), caller[0]) and random.random() == caller[1]
