"""BERT caching its additive attention mask on first use, keyed on nothing, and warmed up
at build time on a batch of four tokens (imports only torch and ``adv_bert``; probe round
r): on the diff's inputs its forward raises. The exit-2 line named "Model", not the
port's build."""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


class CachedMask(adv_bert.Bert):
    cached: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.cached is None:
            self.cached = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, self.cached)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def build(reference: Any) -> CachedMask:
    model = adv_bert.load(CachedMask(reference.config), reference)
    ids = torch.tensor([[101, 2023, 2003, 102]])
    with torch.no_grad():
        model(ids, torch.zeros_like(ids), torch.ones_like(ids))
    return model
