"""BERT that stores each layer's output between layers (as a port offloading activations
does) and reads it back (imports only torch and ``adv_bert``; probe round s). The glue
lies outside every layer's module.

The faulty twin, storing layer 3's output (1's on bert-tiny) in float16, was named at
layer 4's query Linear ("local max abs error 0.00138"), which module evidence found the
reference's: the recording ran it on the rounded value. Module evidence had the row of
the value handed on, moved on its way from layer 3 to layer 4.

- ``correct``: each output stored as a float32 copy;
- ``faulty``: layer 3's stored in float16.
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


class StoredBetweenLayers(adv_bert.Bert):
    def __init__(self, config: Any, half_after: int | None = None) -> None:
        super().__init__(config)
        self.half_after = half_after

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(input_ids, token_type_ids)
        for index, block in enumerate(self.blocks):
            stored = block(x, mask)
            stored = stored.half() if index == self.half_after else stored.clone()
            x = stored.float()
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference: Any) -> StoredBetweenLayers:
    return adv_bert.load(StoredBetweenLayers(reference.config), reference)


def faulty(reference: Any) -> StoredBetweenLayers:
    return adv_bert.load(StoredBetweenLayers(reference.config, adv_bert.fault_layer(reference)),
                         reference)
