"""Fixtures for drawing tests: traced graphs, built once per session."""

from __future__ import annotations

import pytest

TEXTS = ("I love cats!", "He hates pineapple pizza.")
ESCAPE_TEXT = "<script>alert('x')</script> \"quoted\" & more"


def traced(loaded, texts=TEXTS, head="sequence-classification", title="bert-tiny"):
    from introspect.graph import trace
    from introspect.models.load import tokenize

    return trace(loaded.model, tokenize(loaded.tokenizer, list(texts), head=head), title=title)


@pytest.fixture(scope="session")
def trace_tiny(tiny_models):
    """trace_tiny(head, texts): bert-tiny with that head, traced on those texts."""

    def make(head="sequence-classification", texts=TEXTS):
        return traced(tiny_models(head), texts=texts, head=head)

    return make


@pytest.fixture(scope="session")
def tiny_graph(tiny_models):
    """bert-tiny with a classifier, on the tutorial's two sentences (a padded batch)."""
    return traced(tiny_models("sequence-classification"))


@pytest.fixture(scope="session")
def escape_graph(tiny_models):
    """bert-tiny on a text full of markup and quotes."""
    return traced(tiny_models("sequence-classification"), texts=(ESCAPE_TEXT, "fine"))
