"""The capture keeps a value equal bit for bit to one kept already as that one tensor
(memory: a close port's four kept calls cost about one forward's values), and module
evidence runs a module again on copies, so a value shared with the reference stays as it
was. Small models of plain torch, written here."""

from __future__ import annotations

import copy

import torch

from introspect.run.capture import capture_calls, probe
from introspect.run.truth import run_truth, same_view


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(8, 8)
        self.act = torch.nn.GELU()
        self.last = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.act(self.first(x)))


def _values(calls, name, mode):
    call = next(c for c in calls.calls if c.name == name and c.mode == mode)
    return [leaf.value for leaf in call.inputs + call.outputs]


def test_the_no_grad_calls_repeat_is_kept_as_the_autograd_calls_values():
    model, x = _Net().eval(), torch.randn(3, 8)
    with capture_calls(model) as calls:
        run_truth(model, {"x": x})
    for name in ("first", "act", "last"):
        autograd, no_grad = _values(calls, name, "autograd"), _values(calls, name, "no_grad")
        assert all(a is b for a, b in zip(autograd, no_grad, strict=True))


def test_a_candidates_equal_values_are_kept_as_the_references():
    reference, x = _Net().eval(), torch.randn(3, 8)
    candidate = copy.deepcopy(reference)
    with torch.no_grad():
        candidate.last.bias.add_(1.0)  # its last output differs: kept as its own
    with capture_calls(reference) as ref_calls:
        run_truth(reference, {"x": x})
    with capture_calls(candidate, share=ref_calls) as cand_calls:
        run_truth(candidate, {"x": x}, grad_calls=2)
    mine, theirs = _values(cand_calls, "act", "autograd"), _values(ref_calls, "act", "autograd")
    assert all(a is b for a, b in zip(mine, theirs, strict=True))
    last_out = _values(cand_calls, "last", "autograd")[-1]
    assert not any(last_out is v for v in _values(ref_calls, "last", "autograd"))
    # the call's own arguments hold the kept tensor too: the repeat's memory is let go
    call = next(c for c in cand_calls.calls if c.name == "last" and c.mode == "autograd")
    assert call.args[0] is call.inputs[0].value


def test_equal_values_probe_equal_and_views_of_one_value_are_the_same():
    a = torch.tensor([0.0, -0.0, float("nan"), 1.5])
    b = torch.tensor([-0.0, 0.0, float("nan"), 1.5])
    assert probe(a) == probe(b)
    assert probe(a) != probe(torch.tensor([0.0, 0.0, 0.0, 1.25]))
    base = torch.randn(4, 6)
    assert same_view(base.detach(), base.detach()) and not same_view(base, base.t())


def test_a_probe_reads_each_dtypes_values_exactly_and_parts_them_as_their_bits_do():
    """The probe reads Python floats: equal where the float64 copies' bytes were (NaN and
    infinities as 0, -0 as 0), apart wherever one probed element differs, in any dtype."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        value = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
        probed = probe(value)
        assert len(probed) == 16 and probe(value.clone()) == probed
        assert probe(value, 4) == tuple(value.reshape(-1)[[0, 39, 79, 119]].double().tolist())
        apart = value.clone().reshape(-1)
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
        apart.view(bits)[119] ^= 1  # its last bit: one ulp of its dtype
        assert probe(apart, 4) != probe(value, 4)
    odd = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    assert probe(odd) == (0.0, 0.0, 0.0, 0.0) == probe(torch.zeros(4))
    assert probe(torch.zeros(0)) == ()


def test_a_module_run_again_cannot_edit_the_references_values():
    from introspect.diff.modules import gather_module_evidence

    class _Edits(torch.nn.Module):  # edits its input in place, only when run again
        def __init__(self) -> None:
            super().__init__()
            self.runs = 0

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            self.runs += 1
            if self.runs > 3:  # the three plain calls came first
                h.mul_(3.0)
            return h * 1.001  # near the reference's (paired by value), over its budget

    class _Wrapped(_Net):
        def __init__(self, act: torch.nn.Module, glue: float = 1.0) -> None:
            super().__init__()
            self.act, self.glue = act, glue

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(self.act(self.first(x) * self.glue))

    reference, x = _Wrapped(torch.nn.Identity()).eval(), torch.randn(3, 8)
    # its act takes a value near the reference's, not equal: run again on the reference's
    candidate = _Wrapped(_Edits(), glue=1 + 1e-6).eval()
    candidate.load_state_dict(reference.state_dict())
    with capture_calls(reference) as ref_calls:
        run_truth(reference, {"x": x})
    kept = [v.clone() for c in ref_calls.calls for v in (leaf.value for leaf in c.outputs)]
    with capture_calls(candidate, share=ref_calls) as cand_calls:
        run_truth(candidate, {"x": x}, grad_calls=2)
    gather_module_evidence(ref_calls, cand_calls, keep_calls=True)
    after = [leaf.value for c in ref_calls.calls for leaf in c.outputs]
    assert candidate.act.runs > 3  # it was run again
    assert all(torch.equal(a, b) for a, b in zip(kept, after, strict=True))


def test_a_value_found_equal_to_one_held_apart_is_known_free_of_nan():
    """``Leaf.nan_free``: a candidate value compared element by element with the
    reference's and found equal holds no NaN (``torch.equal`` is False wherever NaN is),
    so pairing reads it for none; a NaN value is never found equal, and no boundary is
    claimed equal to it bit for bit."""
    from introspect.diff.modules.pairing import _equal_one, reference_boundaries
    from introspect.diff.modules.pairing import closest as nearest

    reference, x = _Net().eval(), torch.randn(3, 8)
    candidate = copy.deepcopy(reference)
    with capture_calls(reference) as ref_calls:
        run_truth(reference, {"x": x})
    with capture_calls(candidate, share=ref_calls) as cand_calls:
        run_truth(candidate, {"x": x}, grad_calls=2)
    call = next(c for c in cand_calls.calls if c.name == "act" and c.mode == "autograd")
    assert all(leaf.nan_free for leaf in call.inputs + call.outputs)
    boundaries = reference_boundaries(ref_calls.of_mode("autograd"))
    assert nearest(call.outputs[0], boundaries, 1e-3).distance == 0.0

    x[0, 0] = float("nan")  # NaN flows through every value: none is ever found equal
    with capture_calls(reference) as ref_calls:
        run_truth(reference, {"x": x})
    with capture_calls(candidate, share=ref_calls) as cand_calls:
        run_truth(candidate, {"x": x}, grad_calls=2)
    call = next(c for c in cand_calls.calls if c.name == "act" and c.mode == "autograd")
    assert not any(leaf.nan_free for leaf in call.inputs + call.outputs)
    boundaries = reference_boundaries(ref_calls.of_mode("autograd"))
    leaf = call.outputs[0]
    assert _equal_one(leaf.value, list(boundaries), leaf.nan_free) is None
    # nor where the two share memory: a NaN value read for its NaN is equal to nothing
    theirs = next(b for b in boundaries if b.module == "act" and b.role == "output")
    assert _equal_one(theirs.value, [theirs], nan_free=False) is None


def test_a_candidates_equal_gradients_are_kept_as_the_references():
    """With ``gradients``, each output's gradient in the first call's backward is kept
    (``Leaf.grad``); the candidate's, equal bit for bit to the reference's for the same
    value, is kept as that one tensor (memory), and one that differs as its own."""
    reference, x = _Net().eval(), torch.randn(3, 8)
    candidate = copy.deepcopy(reference)

    def backward(returned):
        (returned * torch.arange(4.0)).sum().backward()

    with capture_calls(reference, gradients=True) as ref_calls:
        run_truth(reference, {"x": x}, backward=backward)
    candidate.act.register_full_backward_hook(  # what reaches 'first' is doubled
        lambda module, grad_in, grad_out: tuple(g * 2 for g in grad_in))
    with capture_calls(candidate, share=ref_calls, gradients=True) as cand_calls:
        run_truth(candidate, {"x": x}, grad_calls=2, backward=backward)

    def output(calls, name):
        return next(c for c in calls.calls if c.name == name and c.mode == "autograd").outputs[0]

    assert output(ref_calls, "last").grad is not None
    assert same_view(output(cand_calls, "last").grad, output(ref_calls, "last").grad)
    mine, theirs = output(cand_calls, "first"), output(ref_calls, "first")
    assert mine.value is theirs.value  # the same value (the forward agrees) ...
    assert torch.equal(mine.grad, 2 * theirs.grad)  # ... handed another gradient: its own
    assert not same_view(mine.grad, theirs.grad)
    assert all(p.grad is not None for p in candidate.parameters())  # (the test's backward)


def test_a_large_repeat_is_shared_by_its_bytes_and_known_free_of_nan():
    """From ``_BY_BYTES_FROM`` elements a repeat is found by memcmp: the kept tensor is
    shared, flagged free of NaN where its sum is finite; a NaN at the same place (the
    same bytes) is shared but not flagged; -0.0 for 0.0 (other bytes, equal values) is
    shared as ``torch.equal`` finds it."""
    import importlib

    capture = importlib.import_module("introspect.run.capture")
    size = capture._BY_BYTES_FROM
    known = capture._Known()
    first = torch.randn(size)
    assert known.keep(first) == (first, False)
    same, flagged = known.keep(first.clone())
    assert same is first and flagged
    with_nan = torch.randn(size)
    with_nan[7] = float("nan")
    known.keep(with_nan)
    same, flagged = known.keep(with_nan.clone())
    assert same is with_nan and not flagged
    zeros = torch.zeros(size)
    known.keep(zeros)
    same, flagged = known.keep(-zeros.clone())
    assert same is zeros and flagged
