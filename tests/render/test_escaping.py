"""Graphviz's escape sequences in user text are drawn as typed; PDFs are byte-stable."""

from __future__ import annotations

import shutil
import time
from xml.etree import ElementTree

import pytest

from introspect.render import draw_graph, render_bytes
from introspect.render.labels import escape
from introspect.render.output import fixed_pdf_dates

from .conftest import traced

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz not installed")
SEQUENCES = r"\N \G \E \L \T \H \l \n \r \\ end"


def test_escape_doubles_backslashes():
    assert escape(r"a\Nb") == r"a\\Nb"
    assert escape("\\") == "\\\\"


@needs_dot
def test_backslash_sequences_in_text_are_drawn_as_typed(tiny_models):
    graph = traced(tiny_models("sequence-classification"), texts=(SEQUENCES, "fine"),
                   title=r"model \G \N")
    svg = render_bytes(draw_graph(graph), "svg")
    text = " ".join(ElementTree.fromstring(svg).itertext())
    # the tokens of the text, as drawn in the token table, and the title as given
    for token in (r"\\", "n", "g", "end"):
        assert token in text
    assert r"model \G \N" in text
    assert "introspect" not in text.split("model", 1)[1][:20]  # \G not expanded


@needs_dot
def test_the_sequences_themselves_survive_a_render():
    import graphviz

    digraph = graphviz.Digraph("introspect")
    digraph.node("a", label=f"<{escape(SEQUENCES)}>")
    svg = render_bytes(digraph, "svg")
    assert SEQUENCES in " ".join(ElementTree.fromstring(svg).itertext())


@needs_dot
def test_pdf_output_is_byte_stable(tiny_models):
    digraph = draw_graph(traced(tiny_models("sequence-classification")), depth=0)
    first = render_bytes(digraph, "pdf")
    time.sleep(1.1)  # the creation date cairo writes has one-second steps
    assert render_bytes(digraph, "pdf") == first
    assert b"/CreationDate (D:19700101000000" in first


def test_pdf_dates_follow_source_date_epoch(monkeypatch):
    pdf = b"<< /Producer (cairo) /CreationDate (D:20261122041240Z) >>"
    assert fixed_pdf_dates(pdf) == b"<< /Producer (cairo) /CreationDate (D:19700101000000Z) >>"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert fixed_pdf_dates(pdf).endswith(b"(D:20231114221320Z) >>")
    assert len(fixed_pdf_dates(pdf)) == len(pdf)  # xref offsets hold
