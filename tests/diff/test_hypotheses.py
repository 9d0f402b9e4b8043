"""Hints found by testing hypotheses on values (issue 10 item 5), without the engine.

Each ``DivergenceContext`` is built by hand: the reference's value at a block output of
HF BERT (captured with a hook) and the independent port's value at the same quantity
(captured with a hook, or by wrapping the functional port's functions), already in the
reference's layout. Each fault must get a hint naming it, and only hints naming it; a
correct port must get none.
"""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

from introspect.diff.hypotheses import DivergenceContext, explain_divergence
from tests.diff.test_independent_ports import EXPECTED
from tests.ports.batch import port_batch

STYLES = ("hf_like", "nanogpt_style", "functional")
ATOL, RTOL = 1e-5, 1.3e-6

# where each fault first shows, among the block outputs both sides expose
QUANTITY = {
    "position_offset": "embeddings", "token_type_ignored": "embeddings",
    "token_type_twice": "embeddings",
    "qk_swapped": "context", "kv_swapped": "context", "mask_missing": "context",
    "mask_on_query_axis": "context", "mask_fill": "context", "softmax_wrong_dim": "context",
    "scale_1_over_d": "context", "dropout_active": "context",
    "missing_residual": "attention_output", "ln_unbiased_var": "attention_output",
    "ln_eps": "attention_output", "weight_transposed": "attention_output",
    "gelu_tanh": "intermediate", "weight_unloaded": "intermediate",
    "pre_ln": "layer_output", "layers_out_of_order": "layer_output",
    "weight_from_other_layer": "layer_output",
    "pooler_no_tanh": "pooled", "pooler_mean": "pooled",
}
REFERENCE_MODULE = {  # quantity -> (HF module path, layer)
    "embeddings": ("embeddings", "embeddings"),
    "context": ("encoder.layer.{L}.attention.self", "encoder.layer.{L}"),
    "attention_output": ("encoder.layer.{L}.attention.output", "encoder.layer.{L}"),
    "intermediate": ("encoder.layer.{L}.intermediate", "encoder.layer.{L}"),
    "layer_output": ("encoder.layer.{L}.output", "encoder.layer.{L}"),
    "pooled": ("pooler", "pooler"),
}


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _hooked(module: torch.nn.Module, run, *, pre: bool = False) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    if pre:
        handle = module.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    else:
        handle = module.register_forward_hook(lambda m, a, o: seen.append(_first(o).detach()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return seen[0]


def reference_value(model, batch, quantity: str, layer: int) -> torch.Tensor:
    path = REFERENCE_MODULE[quantity][0].replace("{L}", str(layer))
    return _hooked(model.get_submodule(path), lambda: model(**batch))


def _port_module(style: str, port, quantity: str, layer: int):
    """(module, pre-hook?) holding the quantity in a module-based port."""
    if style == "hf_like":
        block = port.encoder.blocks[port.encoder.order[layer]]
        return {"embeddings": (port.embed, False), "context": (block.attn.out_proj, True),
                "attention_output": (block.ln_1, False), "intermediate": (block.mlp.act, False),
                "layer_output": (block, False), "pooled": (port.pooler, False)}[quantity]
    block = port.transformer.h[layer]
    return {"embeddings": (port.transformer.ln_e, False), "context": (block.attn.c_proj, True),
            "attention_output": (block.ln_1, False), "intermediate": (block.mlp.gelu, False),
            "layer_output": (block, False), "pooled": (port.pooler, False)}[quantity]


@contextlib.contextmanager
def _wrapped(module, name: str, record):
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        record(args, out)
        return out

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)


def port_value(style: str, port, batch, quantity: str, layer: int) -> torch.Tensor:
    """The port's value of ``quantity``, in HF's layout."""
    if quantity == "pooled" and style == "nanogpt_style":
        with torch.no_grad():
            return port(**batch)["pooled"]
    if style != "functional":
        module, pre = _port_module(style, port, quantity, layer)
        return _hooked(module, lambda: port(**batch), pre=pre)
    functional = importlib.import_module("tests.ports.functional")
    seen: list[torch.Tensor] = []
    w = port.w
    if quantity == "embeddings":
        name, pick = "embed", lambda args, out: out
    elif quantity == "context":
        name, pick = "linear", lambda args, out: args[0] if args[1] is w[f"l{layer}_wo"] else None
    elif quantity == "attention_output":
        name, pick = "layer_norm", lambda args, out: out if args[1] is w[f"l{layer}_ln1_g"] \
            else None
    elif quantity == "pooled":
        with torch.no_grad():
            return port(**batch)[1]
    else:
        name = {"intermediate": "gelu", "layer_output": "encoder_layer"}[quantity]
        calls = []

        def pick(args, out):
            calls.append(out)
            return out if len(calls) == layer + 1 else None

    with _wrapped(functional, name, lambda a, o: seen.append(v) if (v := pick(a, o))
                  is not None else None), torch.no_grad():
        port(**batch)
    return seen[0].detach()


def context_for(reference, port, style, batch, quantity, layer) -> DivergenceContext:
    module, layer_name = (s.replace("{L}", str(layer)) for s in REFERENCE_MODULE[quantity])
    return DivergenceContext(
        reference_model=reference, candidate_model=port, inputs=batch,
        reference_node=f"{module} output", candidate_node="", module=module, layer=layer_name,
        reference_value=reference_value(reference, batch, quantity, layer),
        candidate_value=port_value(style, port, batch, quantity, layer), atol=ATOL, rtol=RTOL)


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


def _check(reference, batch, style, fault, layer):
    port = importlib.import_module(f"tests.ports.{style}").build(reference, fault, layer=layer)
    context = context_for(reference, port, style, batch, QUANTITY[fault], layer)
    hints = explain_divergence(context)
    keyword = EXPECTED[fault][2]
    assert hints, f"{style} {fault}: no hint"
    wrong = [h for h in hints if keyword not in h.lower()]
    assert not wrong, f"{style} {fault}: hints that do not name the fault: {wrong}"
    return hints


@pytest.mark.parametrize("fault", list(QUANTITY))
@pytest.mark.parametrize("style", STYLES)
def test_each_fault_gets_its_hint_on_bert_tiny(tiny, style, fault):
    reference, batch = tiny
    _check(reference, batch, style, fault, layer=0)


@pytest.mark.parametrize("quantity", list(REFERENCE_MODULE))
@pytest.mark.parametrize("style", STYLES)
def test_a_correct_port_gets_no_hint(tiny, style, quantity):
    reference, batch = tiny
    port = importlib.import_module(f"tests.ports.{style}").build(reference)
    assert explain_divergence(context_for(reference, port, style, batch, quantity, 0)) == ()


def test_a_hint_says_by_how_much(tiny):
    reference, batch = tiny
    hints = _check(reference, batch, "hf_like", "kv_swapped", 0)
    assert hints[0].startswith("keys and values are swapped in the candidate's attention")
    assert "max abs error" in hints[0] and "unmodified" in hints[0]


def test_an_unrelated_fault_gives_no_hint_at_an_unaffected_block(tiny):
    reference, batch = tiny
    port = importlib.import_module("tests.ports.hf_like").build(reference, "pooler_no_tanh")
    assert explain_divergence(context_for(reference, port, "hf_like", batch, "context", 0)) == ()


def test_an_unknown_reference_gets_no_hint(tiny):
    reference, batch = tiny
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    context = context_for(reference, reference, "hf_like", batch, "context", 0)
    context = DivergenceContext(**{**context.__dict__, "reference_model": other,
                                   "candidate_model": other, "layer": "encoder.layer.0"})
    assert explain_divergence(context) == ()


@pytest.mark.slow
@pytest.mark.parametrize("style,fault", [("hf_like", "kv_swapped"), ("functional", "ln_eps"),
                                         ("nanogpt_style", "gelu_tanh"),
                                         ("functional", "position_offset"),
                                         ("nanogpt_style", "layers_out_of_order"),
                                         ("hf_like", "pooler_mean")])
def test_faults_get_their_hint_on_minilm(minilm, style, fault):
    _check(minilm.model, port_batch(minilm.tokenizer), style, fault, layer=2)
