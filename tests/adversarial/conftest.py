"""Fixtures of the adversarial corpus: a perturbed bert-tiny as a checkpoint folder (its
LayerNorms and biases moved off (1, 0) by a fixed seed, so that faults are visible), the
reference loaded from it, and the port files imported by path under unique names."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

PORTS = Path(__file__).resolve().parent / "ports"
SEED = 20
# Port variables set by builders (env_var.py); restored after every test.
PORT_ENV = ("ADV_PORT_TANH_LAYER",)


def perturb(model: torch.nn.Module, seed: int = SEED) -> None:
    """Move every LayerNorm weight and bias and every other bias off its init, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in model.named_parameters():
            noise = torch.randn(value.shape, generator=generator)
            if "LayerNorm.weight" in name:
                value.copy_(1 + 0.3 * noise)
            elif "intermediate.dense.bias" in name:
                value.copy_(1.0 * noise)  # GELU inputs over [-2, 2], where tanh and erf part
            elif name.endswith("bias"):
                value.copy_(0.2 * noise)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """bert-tiny, perturbed, saved as a checkpoint folder (the CLI's --model)."""
    from introspect.load import load_model

    loaded = load_model("bert-tiny")
    perturb(loaded.model)
    folder = tmp_path_factory.mktemp("perturbed-bert-tiny")
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def as_reference(loaded) -> SimpleNamespace:
    return SimpleNamespace(model=loaded.model, config=loaded.model.config,
                           folder=loaded.folder, tokenizer=loaded.tokenizer)


@pytest.fixture(scope="session")
def tiny(tiny_folder):
    """(reference as a builder receives it, the tutorial's padded inputs) on bert-tiny."""
    from introspect.load import load_model, tokenize

    loaded = load_model(str(tiny_folder))
    return as_reference(loaded), tokenize(loaded.tokenizer)


@pytest.fixture(scope="session")
def mini(minilm):
    from introspect.load import tokenize

    return as_reference(minilm), tokenize(minilm.tokenizer)


_imported: dict[Path, object] = {}


def port(relative: str):
    """The port file ``ports/<relative>`` imported by its path, once, under a unique name."""
    path = PORTS / relative
    if path not in _imported:
        if str(PORTS) not in sys.path:
            sys.path.insert(0, str(PORTS))  # the ports' helpers (adv_bert, helper_*)
        name = "adversarial_port_" + relative.replace("/", "_").removesuffix(".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _imported[path] = module
    return _imported[path]


@pytest.fixture(autouse=True)
def _restore_port_environment():
    saved = {name: os.environ.get(name) for name in PORT_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
