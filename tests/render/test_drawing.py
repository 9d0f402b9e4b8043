"""Whole drawings: golden DOT files, stable bytes, SVG that parses, escaped user text.

Rewrite the golden files after an intended change with
``INTROSPECT_UPDATE_GOLDEN=1 pytest tests/render`` and review the diff.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from introspect.render import draw_graph, render_bytes
from tests.golden import check_golden

ESCAPE_TEXT = "<script>alert('x')</script> \"quoted\" & more"  # as in conftest.py

GOLDEN = Path(__file__).parent / "golden"
VIEWS = {
    "bert_tiny_depth1": {"depth": 1},
    "bert_tiny_depth3": {"depth": 3},
    "bert_tiny_folded": {},
    "bert_tiny_full": {"depth": "full"},
}
needs_dot = pytest.mark.skipif(
    __import__("shutil").which("dot") is None, reason="Graphviz 'dot' is not installed"
)


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_golden_dot(tiny_graph, name):
    source = draw_graph(tiny_graph, **VIEWS[name]).source
    check_golden(GOLDEN / f"{name}.dot", source)


def test_same_graph_same_bytes(tiny_graph, trace_tiny):
    again = trace_tiny()  # a second trace of the same model and inputs
    for options in VIEWS.values():
        assert draw_graph(tiny_graph, **options).source == draw_graph(again, **options).source


@needs_dot
def test_svg_parses_and_is_stable(tiny_graph):
    first = render_bytes(draw_graph(tiny_graph), "svg")
    assert first == render_bytes(draw_graph(tiny_graph), "svg")
    root = ElementTree.fromstring(first)
    text = " ".join(root.itertext())
    for expected in (
        "[CLS]",
        "[SEP]",
        "[PAD]",
        "##apple",
        "I love cats!",
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "(2, 8, 128)",
        "(2, 2, 8, 64)",
        "split heads",
        "logits",
        "B=2 batch",
        "×2",
    ):
        assert expected in text, expected
    assert b"0x" not in first  # no memory addresses


@needs_dot
def test_markup_in_text_stays_text(escape_graph):
    dot_source = draw_graph(escape_graph).source
    assert "<script>" not in dot_source and "&lt;script&gt;" in dot_source
    svg = render_bytes(draw_graph(escape_graph), "svg")
    root = ElementTree.fromstring(svg)  # the SVG is still well-formed XML
    assert not [e for e in root.iter() if e.tag.rsplit("}", 1)[-1] == "script"]
    assert ESCAPE_TEXT in " ".join(root.itertext())


@needs_dot
def test_every_format_renders(tiny_graph):
    digraph = draw_graph(tiny_graph, depth=1)
    assert render_bytes(digraph, "png").startswith(b"\x89PNG")
    assert render_bytes(digraph, "pdf").startswith(b"%PDF")
    assert render_bytes(digraph, "dot").startswith(b"digraph introspect {")


def test_draw_method_of_the_graph(tiny_graph):
    digraph = tiny_graph.draw(depth=0)
    assert hasattr(digraph, "_repr_mimebundle_") or hasattr(digraph, "_repr_svg_")
    # the same drawing, bounded to a notebook cell's width
    from introspect.render import NOTEBOOK_WIDTH

    assert digraph.source == draw_graph(tiny_graph, depth=0, max_width=NOTEBOOK_WIDTH).source


HEADS = (
    "base",
    "masked-lm",
    "token-classification",
    "question-answering",
    "multiple-choice",
    "next-sentence",
    "pretraining",
)


@needs_dot
@pytest.mark.parametrize("head", HEADS)
def test_every_head_draws(trace_tiny, head):
    graph = trace_tiny(head)
    for depth in (1, None, "full"):
        source = draw_graph(graph, depth=depth).source
        assert "tokens/text" in source and "output/" in source
    ElementTree.fromstring(render_bytes(draw_graph(graph), "svg"))


def test_eager_attention_names_its_layout(tiny_models):
    from introspect.graph import trace
    from introspect.models.load import tokenize

    loaded = tiny_models("sequence-classification", "eager")
    source = draw_graph(trace(loaded.model, tokenize(loaded.tokenizer))).source
    assert "split heads, transpose" in source and "softmax" in source
    assert "merge heads" in source
