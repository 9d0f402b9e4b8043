"""A hypothesis's run of the layer stops at the divergent quantity: the hints stay the same.

The judge reads one quantity of each run (``explain_divergence``'s ``_up_to``), so the
layer returns once it is computed. Every hypothesis stopped at each quantity must hold
its whole run's values there bit for bit, the hints must be those of whole runs, and a
run stopped at the intermediate must leave the output's Linear out.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from introspect.diff.hypotheses import explain_divergence
from introspect.diff.hypotheses.hypothesis import run_base, run_layer
from introspect.diff.hypotheses.site import locate
from tests.diff.test_hypotheses import QUANTITY, context_for
from tests.ports.batch import port_batch

hypotheses = importlib.import_module("introspect.diff.hypotheses")  # ``introspect.diff``
# is also a function: a dotted path to monkeypatch does not reach the package


class _Linears(TorchFunctionMode):
    """The weights of every ``F.linear`` run under it, in order."""

    def __init__(self):
        super().__init__()
        self.weights: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.weights.append(args[1])
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


def _context(tiny, style: str, fault: str):
    reference, batch = tiny
    port = importlib.import_module(f"tests.ports.{style}").build(reference, fault, layer=0)
    return context_for(reference, port, style, batch, QUANTITY[fault], 0)


def _site(tiny):
    site = locate(_context(tiny, "hf_like", "gelu_tanh"))
    assert site is not None and site.kind == "layer"
    return site


def _runs(site):
    return [h.run() for family in hypotheses.FAMILIES for h in family.hypotheses(site)]


def test_every_hypothesis_stopped_at_a_quantity_holds_its_whole_runs_values(tiny):
    site = _site(tiny)
    whole = _runs(site)
    for name in run_base(site):
        stopped = _runs(dataclasses.replace(site, stop=name))
        for i, (cut, full) in enumerate(zip(stopped, whole, strict=True)):
            assert torch.equal(cut[name], full[name]), f"hypothesis {i} stopped at {name}"


def test_a_run_stopped_at_the_intermediate_leaves_out_the_output_linear(tiny):
    site = dataclasses.replace(_site(tiny), stop="intermediate")
    tanh = next(h for h in hypotheses.activation.hypotheses(site) if "tanh" in h.how)
    with _Linears() as seen:
        values = tanh.run()
    read = ("attention.self.query", "attention.self.key", "attention.self.value",
            "attention.output.dense", "intermediate.dense")
    assert [id(w) for w in seen.weights] == [id(site.weights[f"{m}.weight"]) for m in read]
    assert "output_dense" not in values


@pytest.mark.parametrize("style,fault", [
    ("hf_like", "gelu_tanh"), ("functional", "gelu_tanh"), ("hf_like", "kv_swapped"),
    ("nanogpt_style", "mask_fill"), ("functional", "ln_eps"),
    ("hf_like", "weight_transposed"), ("nanogpt_style", "layers_out_of_order"),
    ("hf_like", "weight_from_other_layer")])
def test_the_hints_are_those_of_whole_runs(tiny, monkeypatch, style, fault):
    context = _context(tiny, style, fault)
    with _Linears() as stopped:
        hints = explain_divergence(context)
    monkeypatch.setattr(hypotheses, "_up_to", lambda site, quantity: site)
    with _Linears() as whole:
        whole_hints = explain_divergence(context)
    assert hints and hints == whole_hints
    if QUANTITY[fault] != "layer_output":  # the layer's last quantity: nothing to leave out
        assert len(stopped.weights) < len(whole.weights)


def test_the_layers_fed_to_a_layer_run_once_for_all_its_order_hypotheses(tiny):
    site = _site(tiny)
    site = dataclasses.replace(site, layers=site.layers * 2)  # four layers: three fed_by
    fed = [h for h in hypotheses.structure.hypotheses(site) if "feeding" in h.how]
    assert len(fed) == 3
    with _Linears() as seen:
        values = [h.run() for h in reversed(fed)][::-1]
    # 6 Linears a run: each layer once, then the layer at the site once per hypothesis
    assert len(seen.weights) == 6 * (len(site.layers) + len(fed))
    for later, value in enumerate(values, start=1):
        x = site.block_input
        for i in range(later + 1):  # as the reference chains them
            x = run_layer(site, weights=site.layers[i], block_input=x)["layer_output"]
        assert torch.equal(value["layer_output"], run_layer(site, block_input=x)["layer_output"])
