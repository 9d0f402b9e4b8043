"""BERT-base: twelve identical layers drawn once, marked ×12 exactly once."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ElementTree

import pytest

from introspect.render import draw_graph, render_bytes

pytestmark = pytest.mark.xdist_group("render_bert_base")  # one worker traces BERT-base once


@pytest.fixture(scope="module")
def base_graph():
    from introspect.graph import trace
    from introspect.models.load import load_model, tokenize

    loaded = load_model("bert-base", head="sequence-classification")
    return trace(loaded.model, tokenize(loaded.tokenizer), title="bert-base")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz 'dot' is not installed")
def test_folded_svg_names_x12_once(base_graph):
    svg = render_bytes(draw_graph(base_graph), "svg")
    text = " ".join(ElementTree.fromstring(svg).itertext())
    assert text.count("×12") == 1 and "encoder.layer.0–11 ×12" in text
    # the legend of named dims, wrapped so the title is no wider than a notebook cell
    assert "B=2 batch · S=8 tokens · H=768 hidden · nh=12 heads · hd=64 head size" in text
    assert "I=3072 intermediate · V=30522 vocab" in text
    assert "(2, 12, 8, 64)" in text and "(2, 8, 768)" in text
    assert len(svg) < 100_000


@pytest.mark.parametrize("depth", [1, 3, None])
def test_expand_first_and_last(base_graph, depth):
    source = draw_graph(base_graph, depth=depth, expand=[0, -1]).source
    assert source.count("×10") == 1 and "encoder.layer.1–10 ×10" in source
    assert "×12" not in source
