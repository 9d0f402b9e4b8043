"""A three-layer bert-tiny with its biases and LayerNorms moved off (0, 1), so that a
bias added twice or a missing sum shows, saved as a checkpoint folder (the CLI's --model)."""

from __future__ import annotations

from pathlib import Path

import pytest

PORTS = Path(__file__).parent / "port_files"


def three_layer_folder(folder: Path) -> Path:
    import torch
    from transformers import BertModel

    from introspect.models.load import load_model

    tiny = load_model("bert-tiny")
    config = tiny.model.config
    config.num_hidden_layers = 3
    torch.manual_seed(1234)
    model = BertModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.1)
            elif "LayerNorm.weight" in name:
                parameter.normal_(1.0, 0.1)
    model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny3(tmp_path_factory) -> Path:
    return three_layer_folder(tmp_path_factory.mktemp("bert-tiny-3-layers"))


@pytest.fixture(scope="session")
def tiny3_loaded(tiny3):
    """(the reference as a port's build receives it, the tutorial's padded inputs)."""
    from introspect.models.load import load_model, tokenize
    from introspect.models.ports import LoadedReference

    loaded = load_model(str(tiny3))
    reference = LoadedReference(loaded.model, loaded.model.config, loaded.folder,
                                loaded.tokenizer, loaded.source, loaded.head, loaded.attn)
    return reference, tokenize(loaded.tokenizer)
