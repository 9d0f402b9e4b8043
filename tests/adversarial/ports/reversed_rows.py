"""BERT that runs its batch rows in reverse order and puts them back at the end (imports
only torch and ``adv_bert``; probe round p). A port that sorts its rows by length does
the same: every value is computed row for row, in its own order.

The op-level pairs, proven by their weights, compared each value with the reference's
row for row in the reference's order: a correct port FAILED at its word embeddings by
0.75 (max abs error 17 over the nodes).

- ``correct``: BERT's arithmetic, rows reversed and back;
- ``faulty``: the same, layer 3's output LayerNorm (1's on bert-tiny) with eps 1e-5.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


class ReversedRows(adv_bert.Bert):
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        flipped = super().forward(input_ids.flip(0), token_type_ids.flip(0),
                                  attention_mask.flip(0))
        return {name: value.flip(0) for name, value in flipped.items()}


def correct(reference: Any) -> ReversedRows:
    return adv_bert.load(ReversedRows(reference.config), reference)


def faulty(reference: Any) -> ReversedRows:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].norm2.eps = 1e-5
    return model
