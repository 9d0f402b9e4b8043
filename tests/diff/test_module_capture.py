"""``introspect.run.capture``: what the global hooks keep of a plain call."""

from __future__ import annotations

import threading

import torch
from torch import nn

from introspect.diff.modules.pairing import relate_parameters
from introspect.run.capture import capture_calls


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.lin(x))


class _Outer(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.inner(x))


def _names(calls):
    return [c.name for c in calls.calls]


def test_compiled_module_is_seen_at_its_own_boundary_only():
    torch._dynamo.reset()
    model = _Outer(torch.compile(_Inner(), backend="eager")).eval()
    x = torch.randn(2, 4)
    with capture_calls(model) as calls:
        with torch.no_grad():
            model(x)
    assert _names(calls) == ["inner", "head", ""]  # nothing inside the compiled region
    assert calls.calls[0].outputs[0].value.shape == (2, 4)


def test_a_vmapped_module_is_one_call_over_the_whole_batch():
    """A module mapped over the rows by ``vmap`` is kept as one call on the whole batch
    (each batched value's underlying tensor, its batch dim first), the positional
    arguments it was mapped over named: a run of it alone maps it again."""
    class PerRow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Inner()

        def forward(self, x):
            return torch.func.vmap(self.inner, in_dims=1)(x)

    model = PerRow().eval()
    x = torch.randn(4, 3)
    with capture_calls(model) as calls:
        out = model(x)
    assert not calls.vmapped
    inner = next(c for c in calls.calls if c.name == "inner")
    assert inner.batched == frozenset({0})
    assert torch.equal(inner.inputs[0].value, x.t())  # the batch dim first
    assert torch.equal(inner.outputs[0].value, out)
    assert _names(calls) == ["inner.lin", "inner.act", "inner", ""]


def test_a_module_under_nested_vmaps_is_left_to_its_caller():
    class PerElement(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Inner()

        def forward(self, x):
            return torch.func.vmap(torch.func.vmap(self.inner))(x)

    model = PerElement().eval()
    with capture_calls(model) as calls:
        model(torch.randn(2, 3, 4))
    assert "inner" in calls.vmapped and "inner.lin" in calls.vmapped
    assert _names(calls) == [""]


def test_a_worker_thread_is_seen_and_marked():
    class Threaded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Inner()

        def forward(self, x):
            out = []
            worker = threading.Thread(target=lambda: out.append(self.inner(x)))
            worker.start()
            worker.join()
            return out[0]

    model = Threaded().eval()
    with capture_calls(model) as calls:
        model(torch.randn(2, 4))
    threaded = {c.name for c in calls.calls if c.thread}
    assert threaded == {"inner", "inner.lin", "inner.act"}


def test_only_the_first_call_of_each_grad_mode_is_kept_and_inference_mode_is_not():
    model = _Inner().eval()
    x = torch.randn(2, 4)
    with capture_calls(model) as calls:
        model(x)
        model(x)
        with torch.no_grad():
            model(x)
        with torch.inference_mode():
            model(x)
    assert [(c.name, c.mode) for c in calls.calls] == [
        ("lin", "autograd"), ("act", "autograd"), ("", "autograd"),
        ("lin", "no_grad"), ("act", "no_grad"), ("", "no_grad")]


def test_an_output_edited_in_place_afterwards_is_marked_changed():
    class Edits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            y = self.lin(x)
            y += 1
            return y

    model = Edits().eval()
    with capture_calls(model) as calls:
        with torch.no_grad():
            model(torch.randn(2, 4))
    lin = next(c for c in calls.calls if c.name == "lin")
    assert not lin.outputs[0].unchanged()


def test_hooks_are_removed_afterwards():
    tables = (torch.nn.modules.module._global_forward_hooks,
              torch.nn.modules.module._global_forward_pre_hooks,
              torch.nn.modules.module._global_forward_hooks_with_kwargs)
    before = [dict(t) for t in tables]
    with capture_calls(_Inner()):
        pass
    assert [dict(t) for t in tables] == before  # (with_kwargs: PyTorch leaves its id)


def test_parameters_relate_as_they_are_transposed_and_fused():
    reference = _Outer(_Inner())
    fused = nn.Linear(4, 8)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([reference.inner.lin.weight, reference.head.weight]))
    candidate = nn.ModuleDict({"t": nn.Linear(4, 4), "fused": fused})
    with torch.no_grad():
        candidate["t"].weight.copy_(reference.head.weight.t())
    related = relate_parameters(reference, candidate)
    assert related["t.weight"] == {"head.weight"}
    assert related["fused.weight"] == {"inner.lin.weight", "head.weight"}



def test_large_weights_relate_across_dtypes_a_block_of_rows_at_a_time(monkeypatch):
    """Weights past the exact key are compared in float32 a block of rows at a time (a whole
    vocabulary cast at once held a second model at the diff's peak); one value apart, none."""
    from introspect.diff.modules import pairing

    monkeypatch.setattr(pairing, "_CHUNK", 1000)  # several blocks of a 96 x 64 weight
    reference = nn.ModuleDict({"big": nn.Linear(64, 96), "other": nn.Linear(64, 96)})
    candidate = nn.ModuleDict({"cast": nn.Linear(64, 96), "t": nn.Linear(96, 64),
                               "apart": nn.Linear(64, 96)}).to(torch.float64)
    with torch.no_grad():
        candidate["cast"].weight.copy_(reference["big"].weight)
        candidate["t"].weight.copy_(reference["big"].weight.t())
        candidate["apart"].weight.copy_(reference["other"].weight)
        candidate["apart"].weight[50, 30] += 1.0  # off the key's grid
    related = relate_parameters(reference, candidate)
    assert related["cast.weight"] == related["t.weight"] == {"big.weight"}
    assert related["apart.weight"] == set()


def test_each_weight_is_compared_once_with_each_reference_weight_and_its_transpose(monkeypatch):
    """A candidate weight is held against the reference's weights and their transposes, not
    its own transpose against them again (the same comparisons): each found once."""
    from introspect.diff.modules import pairing

    compared = []
    equal = pairing._equal_how
    monkeypatch.setattr(pairing, "_EXACT_KEY", 0)  # every weight compared in full
    monkeypatch.setattr(pairing, "_equal_how", lambda a, b: compared.append(1) or equal(a, b))
    reference = nn.ModuleDict({"a": nn.Linear(8, 8), "b": nn.Linear(8, 8)})
    candidate = nn.ModuleDict({"same": nn.Linear(8, 8), "t": nn.Linear(8, 8),
                               "apart": nn.Linear(8, 8)})
    with torch.no_grad():
        candidate["same"].weight.copy_(reference["a"].weight)
        candidate["t"].weight.copy_(reference["b"].weight.t())  # square: both keys fit
        candidate["apart"].weight.copy_(reference["a"].weight.t())
        candidate["apart"].weight[3, 5] += 1.0
        for name in candidate:
            candidate[name].bias.copy_(reference["a"].bias)
    related = relate_parameters(reference, candidate)
    assert related["same.weight"] == {"a.weight"}
    assert related["t.weight"] == {"b.weight"}
    assert related["apart.weight"] == set()
    assert len(compared) == 2 + 3  # a weight each, a bias each (keys part the rest)

def test_nested_tensors_are_left_out():
    """PyTorch's encoder fast path hands nested tensors between layers: no values to pair."""
    class Nest(nn.Module):
        def forward(self, x):
            return torch.nested.nested_tensor([x[0], x[1, :2]])

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.nest = Nest()

        def forward(self, x):
            return self.nest(x)

    model = Outer().eval()
    with capture_calls(model) as calls:
        with torch.no_grad():
            model(torch.randn(2, 3, 4))
    nest = next(c for c in calls.calls if c.name == "nest")
    assert nest.outputs == [] and len(nest.inputs) == 1
