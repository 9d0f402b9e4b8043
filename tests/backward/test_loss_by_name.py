"""The default losses read the outputs HF names (``logits``; ``start_logits`` and
``end_logits``) by name where a model names them: a correct port returning
``{"last_hidden_state", "logits"}``, or its end logits before its start logits, was
read by position and FAILED the backward, or was refused (probe round m)."""

from __future__ import annotations

import pytest
import torch

from introspect.diff.backward.losses import default_loss


def _inputs():
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.long)}


@pytest.mark.parametrize("kind, names", [
    ("token-classification", ("logits", "last_hidden_state")),
    ("masked-lm", ("logits", "last_hidden_state")),
    ("sequence-classification", ("logits", "pooler_output")),
    ("question-answering", ("start_logits", "end_logits")),
])
def test_a_loss_reads_the_outputs_by_their_names(kind, names):
    generator = torch.Generator().manual_seed(1)
    shapes = {"logits": (2, 6, 50) if kind in ("token-classification", "masked-lm") else (2, 3),
              "last_hidden_state": (2, 6, 8), "pooler_output": (2, 8),
              "start_logits": (2, 6), "end_logits": (2, 6)}
    values = {name: torch.randn(shapes[name], generator=generator) for name in names}
    as_hf = dict(values)
    reordered = dict(reversed(list(values.items())))
    loss = default_loss(kind)
    assert torch.equal(loss(as_hf, _inputs()), loss(reordered, _inputs()))
    if kind == "question-answering":  # (by position, the two swapped differ)
        assert not torch.equal(loss(as_hf, _inputs()),
                               loss(tuple(reordered.values()), _inputs()))


def test_a_tuple_is_read_by_position():
    logits = torch.randn(2, 6, 50, generator=torch.Generator().manual_seed(2))
    loss = default_loss("masked-lm")
    assert torch.equal(loss((logits,), _inputs()), loss({"logits": logits}, _inputs()))
