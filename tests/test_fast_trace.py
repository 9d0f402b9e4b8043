"""The fast tracer gives the full trace's graph, node for node; threads and failures are safe."""

from __future__ import annotations

import contextlib
import threading
import types

import pytest
import torch

from introspect.errors import TraceError
from introspect.models.load import HEADS
from introspect.tracing import replay as layer_replay
from introspect.tracing.tracer import trace_module
from tests.conftest import make_batch


def _node_rows(gm: torch.fx.GraphModule) -> list[tuple[str, ...]]:
    """Everything a node is: name, op, target, args, kwargs, shapes, values, module stack."""
    return [(n.name, n.op, str(n.target), str(n.args), str(n.kwargs),
             str(n.meta.get("tensor_meta")), str(n.meta.get("value")),
             str(n.meta.get("nn_module_stack")), str(n.meta.get("type")), str(n.type))
            for n in gm.graph.nodes]


@contextlib.contextmanager
def _counting_replays(paths: list[str]):
    """Record the path of every layer replayed instead of traced."""
    original = layer_replay.replay

    def counted(record, path, mapping, tracer):
        paths.append(path)
        return original(record, path, mapping, tracer)

    layer_replay.replay = counted
    try:
        yield
    finally:
        layer_replay.replay = original


def _inputs(head: str) -> dict[str, torch.Tensor]:
    return make_batch(2, 9, padded=True, choices=3 if head == "multiple-choice" else 0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("head", list(HEADS))
def test_fast_graph_equals_the_full_trace_node_for_node(head, attn):
    from introspect.models.load import load_model

    # A model of its own: the session's shared ones may carry the forward hooks HF leaves on
    # every layer after a call with output_attentions=True, and a layer with hooks of its
    # own is rightly traced in full, not replayed.
    model = load_model("bert-tiny", head=head, attn=attn).model
    inputs = _inputs(head)
    replays = []
    with _counting_replays(replays):
        fast = trace_module(model, inputs, cache=False)
    full = trace_module(model, inputs, fast=False, cache=False)
    assert replays == ["encoder.layer.1"] if head == "base" else ["bert.encoder.layer.1"]
    assert _node_rows(fast.gm) == _node_rows(full.gm)
    assert fast.gm.code == full.gm.code
    assert fast.decisions == full.decisions
    assert fast.output_names == full.output_names
    assert fast.notes == []  # bert-tiny's second layer was replayed, not traced again
    with torch.no_grad():
        expected = {k: v for k, v in model(**inputs).items() if v is not None}
        got = fast.gm(**inputs)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


class _Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.norm(torch.relu(self.dense(x)) * scale + x)


class _Stack(torch.nn.Module):
    """Layers in a ModuleList; ``scales`` makes one layer's call differ from the others'."""

    def __init__(self, layers: int = 3, scales: tuple[float, ...] = (), shared: bool = False):
        super().__init__()
        block = _Block(8)
        self.layers = torch.nn.ModuleList(
            [block] * layers if shared else [_Block(8) for _ in range(layers)])
        self.scales = scales or (1.0,) * layers

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = input_ids
        for layer, scale in zip(self.layers, self.scales, strict=True):
            x = layer(x, scale)
        return x


class _Pairs(torch.nn.Module):
    """Layers taking two inputs: layer 0 gets the same node twice, layer 1 two nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_PairBlock(), _PairBlock()])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = input_ids * 1.0
        y = self.layers[0](x, x)
        return self.layers[1](y, y + 1.0)


class _PairBlock(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2.0 - b


@pytest.mark.parametrize("stack", [
    _Pairs(),  # the same argument metadata, but one node where there are two
    _Stack(),
    _Stack(scales=(1.0, 2.0, 1.0)),  # layer 1 is called differently: traced in full
    _Stack(shared=True),  # one module called three times (ALBERT-style)
], ids=["pairs", "same", "one-differs", "shared"])
def test_replay_matches_the_full_trace_or_falls_back(stack):
    torch.manual_seed(0)
    inputs = {"input_ids": torch.randn(2, 5, 8)}
    fast = trace_module(stack, inputs, cache=False)
    full = trace_module(stack, inputs, fast=False, cache=False)
    assert _node_rows(fast.gm) == _node_rows(full.gm)
    with torch.no_grad():
        assert torch.equal(fast.gm(**inputs)["output"], stack(**inputs))


def test_a_method_patched_on_one_layer_is_traced_not_replayed_nor_cached():
    stack, inputs = _Stack(), {"input_ids": torch.randn(2, 5, 8)}
    before = trace_module(stack, inputs)  # cached: the patch below must miss it
    stack.layers[2].forward = types.MethodType(lambda self, x, scale: self.norm(x),
                                               stack.layers[2])
    fast = trace_module(stack, inputs)
    assert _node_rows(fast.gm) == _node_rows(trace_module(stack, inputs, fast=False,
                                                          cache=False).gm)
    assert _node_rows(fast.gm) != _node_rows(before.gm)
    with torch.no_grad():
        assert torch.equal(fast.gm(**inputs)["output"], stack(**inputs))


class _HFStack(torch.nn.Module):
    """HF's own layers (replayable) in a ModuleList; layer 1 also gets a mask."""

    def __init__(self) -> None:
        super().__init__()
        import transformers

        config = transformers.BertConfig(hidden_size=8, num_attention_heads=2,
                                         intermediate_size=16)
        self.layers = torch.nn.ModuleList([transformers.models.bert.modeling_bert.BertLayer(
            config) for _ in range(3)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.layers[0](input_ids)
        x = self.layers[1](x, (input_ids[:, None, None, :, 0] > 5) * -1e4)
        return self.layers[2](x)


def test_a_layer_called_differently_is_traced_in_full_and_said():
    # Layer 1 gets a mask the others do not: traced in full, and said.
    model, inputs = _HFStack().eval(), {"input_ids": torch.randn(2, 5, 8)}
    fast = trace_module(model, inputs, cache=False)
    assert fast.notes[0] == ("layer layers.1 was traced in full: its arguments differ from "
                             "those of layers.0")
    with torch.no_grad():
        assert torch.equal(fast.gm(**inputs)["output"], model(**inputs))


def test_a_ports_layers_are_each_traced_never_replayed():
    """A port's layer may pick its graph by anything (here a scale the root passes in,
    elsewhere a private flag): each is traced for real, so nothing needs saying."""
    inputs = {"input_ids": torch.randn(2, 5, 8)}
    scaled = _Stack(scales=(1.0, 1.0, 2.0))
    traced = trace_module(scaled, inputs, cache=False)
    assert traced.notes == []
    assert torch.equal(traced.gm(**inputs)["output"], scaled(**inputs))


def test_traces_from_several_threads_then_a_plain_forward(tiny_models):
    model = tiny_models("base").model
    inputs = make_batch(2, 9, padded=True)
    expected = trace_module(model, inputs, cache=False).gm.code
    codes, errors = [], []

    def work() -> None:
        try:
            codes.append(trace_module(model, inputs, cache=False).gm.code)
        except Exception as e:  # a thread's failure must reach the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and codes == [expected] * 4
    with torch.no_grad():
        assert model(**inputs).last_hidden_state.shape == (2, 9, 128)


def test_a_trace_waits_for_another_holding_the_trace_lock(tiny_models, monkeypatch):
    # fx patches nn.Module.__call__ process-wide, and a trace snapshots and restores the
    # model's attributes around it: a trace started while another holds the lock must
    # not begin at all until it is let go (its snapshot would hold the other's proxies)
    from introspect.models import families
    from introspect.tracing.tracer import TRACE_LOCK

    model = tiny_models("base").model
    inputs = make_batch(2, 9, padded=True)
    begun: list[str] = []
    reason = families.untraceable_reason
    monkeypatch.setattr(families, "untraceable_reason",
                        lambda m: begun.append("begun") or reason(m))
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(trace_module(model, inputs,
                                                                      cache=False)))
    with TRACE_LOCK:
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and begun == []  # (waiting: the lock is held here)
    worker.join()
    assert begun == ["begun"] and len(done) == 1


def test_a_trace_failing_midway_leaves_no_patch_behind(tiny_models):
    model = tiny_models("base").model
    call, getattr_ = torch.nn.Module.__call__, torch.nn.Module.__getattr__
    layer = model.encoder.layer[1]

    def broken_forward(*args, **kwargs):
        raise RuntimeError("injected failure in the middle of the trace")

    layer.forward = broken_forward
    try:
        with pytest.raises(TraceError, match="injected failure"):
            trace_module(model, make_batch(2, 9, padded=True), fast=False, cache=False)
    finally:
        del layer.forward
    assert torch.nn.Module.__call__ is call and torch.nn.Module.__getattr__ is getattr_
    with torch.no_grad():
        assert model(**make_batch(2, 9, padded=True)).last_hidden_state.shape == (2, 9, 128)
    assert trace_module(model, make_batch(2, 9, padded=True), cache=False).notes == []


def test_the_collector_stays_paused_until_the_last_trace_ends():
    import gc

    from introspect.tracing.tracer import _collector_paused

    assert gc.isenabled()
    with _collector_paused():  # one trace
        with _collector_paused():  # another, in the middle of it (as a thread would)
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first one is still running
    assert gc.isenabled()
