"""Fixtures for the report tests: a bert-tiny diff that fails in layer 1 (tanh GELU)."""

from __future__ import annotations

import pytest

import introspect
from tests.fixtures.candidates import inject


@pytest.fixture(scope="session")
def tiny_inputs(tiny_models):
    return introspect.tokenize(tiny_models("base", "sdpa").tokenizer)


@pytest.fixture(scope="session")
def failing_diff(tiny_models, tiny_inputs):
    """HF bert-tiny against a from-scratch port whose layer 1 uses the tanh GELU."""
    hf = tiny_models("base", "sdpa").model
    faulty, _ = inject(introspect.scratch.BertModel.from_hf(hf), "tanh-gelu", layer=1)
    return introspect.diff(hf, faulty, tiny_inputs)


@pytest.fixture(scope="session")
def passing_diff(tiny_models, tiny_inputs):
    hf = tiny_models("base", "sdpa").model
    return introspect.diff(hf, introspect.scratch.BertModel.from_hf(hf), tiny_inputs)
