"""Decoders drawn as such: causal mask, RMSNorm, rotary, SwiGLU, grouped-query attention."""

from __future__ import annotations

import html

import introspect
from introspect.render.labels import mask_title, op_title
from tests.fixtures.families import tiny_inputs, tiny_model


def test_llama_parts_are_named_in_its_drawing():
    graph = introspect.trace(tiny_model("llama", "causal-lm"), tiny_inputs("llama"), cache=False)
    svg = html.unescape(graph.draw().pipe(format="svg").decode())  # Graphviz writes &#45;
    for title in ("causal attention mask", "RMSNorm: 1/√(mean x² + eps)",
                  "rotary: rotate half [−x₂, x₁]", "repeat kv heads ×2 (grouped-query)",
                  "SwiGLU: act(gate) × up", "layers.0–1 ×2"):
        assert title in svg, title


def test_gpt2_mask_is_causal_and_an_encoder_mask_is_not():
    gpt2 = introspect.trace(tiny_model("gpt2"), tiny_inputs("gpt2"), cache=False)
    assert "causal attention mask" in gpt2.draw().pipe(format="svg").decode()
    roberta = introspect.trace(tiny_model("roberta"), tiny_inputs("roberta"), cache=False)
    svg = roberta.draw().pipe(format="svg").decode()
    assert "attention mask" in svg and "causal" not in svg


def test_titles_come_from_ops_and_shapes():
    assert op_title("le", "", [(1, 1, 1, 8), (1, 1, 8, 1)], (1, 1, 8, 8)) == \
        "causal mask (key ≤ query)"
    assert op_title("le", "", [(8,), (8,)], (8,)) == "le"  # no square mask: not causal
    assert op_title("expand", "x.self_attn", [(2, 2, 1, 8, 8)], (2, 2, 3, 8, 8)) == \
        "repeat kv heads ×3 (grouped-query)"
    assert op_title("rsqrt", "x.norm", [(2, 8, 1)], (2, 8, 1)) == "RMSNorm: 1/√(mean x² + eps)"
    assert mask_title([("mask", "le", (1, 1, 8, 8))]) == "causal attention mask"
    assert mask_title([("mask", "mul", (2, 1, 1, 8))]) == "attention mask"
