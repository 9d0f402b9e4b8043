"""Every family traced bit-exactly, its layers labelled as it names them, and drawn."""

from __future__ import annotations

import re
import xml.dom.minidom

import pytest
import torch

import introspect
from introspect.models.families import FAMILIES
from tests.fixtures.families import LAYERS, TINY, tiny_inputs, tiny_model


def _heads(family: str) -> list[str]:
    return list(FAMILIES[family].heads)


@pytest.mark.parametrize(("family", "head"),
                         [(f, h) for f in TINY for h in _heads(f) if h != "multiple-choice"])
def test_traced_outputs_equal_the_models(family, head):
    model, inputs = tiny_model(family, head), tiny_inputs(family)
    graph = introspect.trace(model, inputs, cache=False)
    traced = graph.gm(**inputs)
    with torch.no_grad():
        expected = model(**inputs)
    assert list(traced) == [k for k, v in expected.items() if v is not None]
    for name, value in traced.items():
        assert torch.equal(value, expected[name]), (family, head, name)


@pytest.mark.parametrize("family", list(TINY))
def test_layers_are_labelled_as_the_family_names_them(family):
    head = "causal-lm" if FAMILIES[family].decoder else "sequence-classification"
    graph = introspect.trace(tiny_model(family, head), tiny_inputs(family), cache=False)
    labels = list(dict.fromkeys(r.layer for r in graph.records))
    layers = [label for label in labels if re.search(r"\.\d+$", label)]
    assert tuple(layers) == LAYERS[family]
    assert "embeddings" in labels and labels[-1] == "outputs"
    # the head is only what lies outside the backbone: never a layer or the embeddings
    backbone = {"roberta": "roberta.", "distilbert": "distilbert.", "electra": "electra.",
                "albert": "albert.", "gpt2": "transformer.", "llama": "model."}[family]
    inside = [r for r in graph.records if r.layer == "head" and r.module.startswith(backbone)]
    assert inside == []


@pytest.mark.parametrize("family", list(TINY))
def test_the_drawing_folds_identical_layers_and_renders(family):
    head = "causal-lm" if FAMILIES[family].decoder else "masked-lm"
    if head not in FAMILIES[family].heads:
        head = "base"
    graph = introspect.trace(tiny_model(family, head), tiny_inputs(family), cache=False)
    svg = graph.draw().pipe(format="svg").decode()
    xml.dom.minidom.parseString(svg)  # well-formed
    last = len(LAYERS[family]) - 1
    prefix = LAYERS[family][0].rpartition(".")[0]
    assert f"{prefix}.0–{last} ×{last + 1}" in svg  # ALBERT's shared layer: once, ×3
    assert "input_ids" in svg and "logits" in svg or head == "base"


def test_gpt2_token_and_position_embeddings_are_summed_in_the_embeddings():
    graph = introspect.trace(tiny_model("gpt2"), tiny_inputs("gpt2"), cache=False)
    sums = [r for r in graph.records if r.op_type == "add" and "wte" in r.inputs]
    assert sums and all(r.layer == "embeddings" for r in sums)
    assert all(len(r.shape or ()) != 3 for r in graph.records if r.layer == "mask")
