"""Fixtures for attention tests: inputs built once, and a port with two heads swapped."""

from __future__ import annotations

import pytest

SHORT_TEXT = "time flies like an arrow"
PADDED_TEXTS = ("I love cats!", "He hates pineapple pizza.")
HOSTILE_TEXT = "<script>alert('x')</script> \"quoted\" & more"


@pytest.fixture(scope="session")
def tiny_short_maps(tiny_models):
    """bert-tiny (sdpa) on the seed's sentence, one row, no padding."""
    import introspect

    loaded = tiny_models("base", "sdpa")
    inputs = introspect.tokenize(loaded.tokenizer, [SHORT_TEXT])
    return introspect.attention(loaded.model, inputs, title="bert-tiny")
