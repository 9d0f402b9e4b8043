"""Fixtures of the adversarial corpus: a perturbed bert-tiny as a checkpoint folder (its
LayerNorms and biases moved off (1, 0) by a fixed seed, so that faults are visible), the
reference loaded from it, and the port files imported by path under unique names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.adversarial.corpus import PORT_ENV, as_reference, perturb


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """bert-tiny, perturbed, saved as a checkpoint folder (the CLI's --model)."""
    from introspect.models.load import load_model

    loaded = load_model("bert-tiny")
    perturb(loaded.model)
    folder = tmp_path_factory.mktemp("perturbed-bert-tiny")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny(tiny_folder):
    """(reference as a builder receives it, the tutorial's padded inputs) on bert-tiny."""
    from introspect.models.load import load_model, tokenize

    loaded = load_model(str(tiny_folder))
    return as_reference(loaded), tokenize(loaded.tokenizer)


@pytest.fixture(scope="session")
def mini(minilm):
    from introspect.models.load import tokenize

    return as_reference(minilm), tokenize(minilm.tokenizer)


@pytest.fixture(autouse=True)
def _restore_port_environment():
    saved = {name: os.environ.get(name) for name in PORT_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def llama_tiny():
    """llama-tiny (random init, RMSNorm eps 1e-6) and the default texts."""
    from introspect.models.load import load_model, tokenize

    loaded = load_model("llama-tiny")
    return as_reference(loaded), tokenize(loaded.tokenizer)
