"""BERT that pads its sequence to a multiple of 8 (as fast kernels like) and cuts its
output back (imports only torch and ``adv_bert``; probe round q).

No value of its run has the reference's shape but the cut output, so nothing of it pairs
but the outputs. Its faulty twin (layer 3's output LayerNorm with eps 1e-5, under the
outputs' budget) failed on the whole models' float64 check, named in the embeddings:
the cut output was the only value held against the embeddings' output, 30 from it.

A tanh GELU in layer 3 moves the outputs past their budget; the one op-level pair it
fails at is the cut output, run on the reference's values from before every block, and
it was named in layer 5.

- ``correct``: BERT's arithmetic over the padded sequence;
- ``faulty``: the same, layer 3's output LayerNorm with eps 1e-5;
- ``faulty_gelu``: the same, layer 3's GELU the tanh one.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch
import torch.nn.functional as F


class PaddedToEight(adv_bert.Bert):
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        S = input_ids.shape[1]
        extra = (-S) % 8
        out = super().forward(F.pad(input_ids, (0, extra)), F.pad(token_type_ids, (0, extra)),
                              F.pad(attention_mask, (0, extra)))
        return {"last_hidden_state": out["last_hidden_state"][:, :S],
                "pooler_output": out["pooler_output"]}


def correct(reference: Any) -> PaddedToEight:
    return adv_bert.load(PaddedToEight(reference.config), reference)


def faulty(reference: Any) -> PaddedToEight:
    model = correct(reference)
    model.blocks[adv_bert.fault_layer(reference)].norm2.eps = 1e-5
    return model


def faulty_gelu(reference: Any) -> PaddedToEight:
    return adv_bert.tanh_in_fault_layer(correct(reference), reference)
