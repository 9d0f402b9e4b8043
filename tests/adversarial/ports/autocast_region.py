"""One layer run inside an autocast region set by its caller (imports only torch).

Written from ``adv_bert``'s ``Bert``, whose loop over the blocks is the caller here:

- ``correct``: layer ``fault_layer`` run inside ``torch.autocast("cpu", enabled=False)``
  (a region a user writes to keep a block in float32 under a global autocast);
- ``faulty``: the same layer inside ``torch.autocast("cpu", dtype=torch.bfloat16)``, its
  output cast back to float32: the layer computes in bf16 (0.008 at bert-tiny's outputs).

Module evidence runs each module again alone on the reference's inputs; run outside the
region its caller set, the faulty layer computed in float32 and passed, so the FAIL named
only the outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from adv_bert import Bert, fault_layer, load


class RegionBert(Bert):
    def __init__(self, config: Any, region: int, enabled: bool) -> None:
        super().__init__(config)
        self.region, self.enabled = region, enabled

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for index, block in enumerate(self.blocks):
            if index == self.region:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.enabled):
                    x = block(x, mask).float()
            else:
                x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def _build(reference: Any, enabled: bool) -> RegionBert:
    if type(reference.model).__name__ != "BertModel":
        raise ValueError("a bare encoder; diff it with --head base")
    return load(RegionBert(reference.config, fault_layer(reference), enabled), reference)


def correct(reference: Any) -> RegionBert:
    return _build(reference, enabled=False)


def faulty(reference: Any) -> RegionBert:
    return _build(reference, enabled=True)
