"""A frozen, inference-only port: ``adv_bert``'s BERT with every weight turned into a
buffer (imports only torch). Its forward agrees with the reference; under
``--backward`` no gradient can reach a weight, since it holds no parameters."""

from __future__ import annotations

from typing import Any

from adv_bert import build
from torch import nn


def _as_buffers(module: nn.Module) -> None:
    for child in module.children():
        _as_buffers(child)
    for name, parameter in list(module.named_parameters(recurse=False)):
        del module._parameters[name]
        module.register_buffer(name, parameter.detach().clone())


def frozen(reference: Any) -> nn.Module:
    model = build(reference)
    _as_buffers(model)
    return model
