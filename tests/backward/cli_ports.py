"""Builders for ``introspect diff --candidate tests/backward/cli_ports.py:NAME --backward``
and a loss for ``--loss``: the hand-written port of ``ports.py``, correct or with a bug."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import ports  # noqa: E402


def correct(reference):
    return ports.build(reference.model)


def custom_gelu(reference):
    return ports.build(reference.model, "custom_gelu", layer=1)


def squares(outputs, inputs):
    """A loss over the first output's first 7 features, at real tokens only."""
    first = outputs[0]
    keep = inputs["attention_mask"].unsqueeze(-1).to(first.dtype)
    return (first[..., :7] * keep).pow(2).sum() / keep.sum()


def reads_an_attribute(outputs, inputs):
    """A loss written against HF's output object (``outputs.logits``): the port returns a
    plain container, and the loss raises on the candidate's outputs only."""
    return outputs.logits.pow(2).mean()
