"""Fixtures for the diff tests: bert-tiny in HF, its from-scratch port, the tutorial's inputs."""

from __future__ import annotations

import pytest

import introspect.scratch as scratch
from introspect.models.load import tokenize


@pytest.fixture(scope="session")
def tiny(tiny_models):
    """The HF bert-tiny base model (sdpa)."""
    return tiny_models("base", "sdpa").model


@pytest.fixture(scope="session")
def inputs(tiny_models):
    """The tutorial's padded pair, tokenized."""
    return tokenize(tiny_models("base", "sdpa").tokenizer)


@pytest.fixture(scope="session")
def port(tiny):
    """The from-scratch BertModel holding bert-tiny's weights."""
    return scratch.BertModel.from_hf(tiny)


@pytest.fixture(scope="session")
def tiny_diff(tiny, port, inputs):
    """HF against the from-scratch port: parity holds, bit for bit."""
    import introspect

    return introspect.diff(tiny, port, inputs)
