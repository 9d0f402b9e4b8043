"""A loss of your own for ``introspect diff --backward --loss examples/ci/my_loss.py:loss``.

``loss(outputs, inputs)`` receives each side's outputs and the inputs it was fed, and returns
one scalar; both models are differentiated through it. This one pulls every real token's
last hidden state towards zero (padding never counts), which reaches every weight of an
encoder: HF's ``BaseModelOutput`` and ``examples/ci/my_port.py``'s dict both answer to
``outputs["last_hidden_state"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def loss(outputs: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    hidden = outputs["last_hidden_state"]
    keep = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).pow(2).sum() / (keep.sum() * hidden.shape[-1])
