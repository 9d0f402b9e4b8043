"""The one-token steps' flat log of calls (``generation.call_log``): the graph it builds is
the one ``record_forward`` builds for the same step, node for node, name for name, value
for value, at every step of a real generation; and its signature tells structures apart
that differ by one op, one target or one input."""

from __future__ import annotations

import copy

import pytest
import torch

from introspect.diff.generation.call_log import log_forward
from introspect.diff.generation.protocol import call_keywords, logits_and_cache
from introspect.diff.ops.eager import record_forward
from tests.generate import gpt2_concat, llama_static
from tests.generate.gpt2_restructured import CHANGE_AT_LENGTH, RestructuredGPT2

from .conftest import PROMPT

STEPS = 4
VARIANTS = ("extra-op", "other-target", "other-wiring", "wrong-wiring")


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape \
            and a.stride() == b.stride() and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(
            _same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b)


def _as_names(value):
    """A node's argument with every node replaced by its name (to compare two graphs)."""
    return torch.fx.node.map_arg(value, lambda node: ("node", node.name))


def _assert_same_recording(eager, built):
    eager_nodes, built_nodes = list(eager.gm.graph.nodes), list(built.gm.graph.nodes)
    assert [n.name for n in built_nodes] == [n.name for n in eager_nodes]
    for e, b in zip(eager_nodes, built_nodes, strict=True):
        assert (b.op, b.target) == (e.op, e.target), e.name
        assert _as_names(b.args) == _as_names(e.args), e.name
        assert _as_names(b.kwargs) == _as_names(e.kwargs), e.name
        assert b.meta.get("nn_module_stack") == e.meta.get("nn_module_stack"), e.name
        assert set(b.meta) == set(e.meta), e.name
    assert built.gm.code == eager.gm.code
    assert built.input_names == eager.input_names
    assert built.output_names == eager.output_names
    assert set(built.values) == set(eager.values)
    for name, value in eager.values.items():  # kept values, bit for bit
        assert _same_value(built.values[name], value), name
    assert built.versions == eager.versions
    assert list(built.recorded_outputs) == list(eager.recorded_outputs)
    for name, value in eager.recorded_outputs.items():
        assert _same_value(built.recorded_outputs[name], value), name


def _each_step(model, steps=STEPS):
    """The inputs and keywords of every step of a greedy generation (the prefill first);
    the cache handed out is a copy, the generation goes on with its own."""
    cache, fed = None, PROMPT
    for _ in range(steps):
        yield fed, lambda cache=cache: call_keywords(model, copy.deepcopy(cache))
        with torch.no_grad():
            logits, cache = logits_and_cache("model", model(
                input_ids=fed, **call_keywords(model, cache)))
        fed = logits[0, -1].argmax().reshape(1, 1)


@pytest.mark.parametrize("which", ["hf-gpt2", "gpt2-example", "gpt2-concat", "llama-static",
                                   "hf-llama"])
def test_the_log_builds_what_record_forward_records(which, gpt2, llama, gpt2_example):
    model = {"hf-gpt2": lambda: gpt2, "gpt2-example": lambda: gpt2_example.build(gpt2),
             "gpt2-concat": lambda: gpt2_concat.GPT2(gpt2),
             "llama-static": lambda: llama_static.Llama.from_hf(llama),
             "hf-llama": lambda: llama}[which]().eval()
    signatures = []
    for fed, keywords in _each_step(model):
        eager = record_forward(model, {"input_ids": fed}, "", keywords(), metadata=False,
                               keep_values=True)
        log = log_forward(model, {"input_ids": fed}, keywords())
        _assert_same_recording(eager, log.recording())
        assert len(log.names) == len(log)
        signatures.append(log.signature())
    # one-token steps share one structure (what lets an alignment serve again)
    assert len(set(signatures[1:])) == 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_signature_tells_one_op_one_target_one_input_apart(gpt2, variant):
    port = RestructuredGPT2(gpt2, variant).eval()
    signatures = []
    for cached in (CHANGE_AT_LENGTH - 1, CHANGE_AT_LENGTH):  # the step before, the step of
        with torch.no_grad():
            _, cache = port(torch.arange(cached).reshape(1, cached))
        log = log_forward(port, {"input_ids": PROMPT[:, :1]}, call_keywords(port, cache))
        signatures.append(log.signature())
    assert signatures[0] != signatures[1]
