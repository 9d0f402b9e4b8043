"""BERT that runs each row on its real tokens alone and writes it back into a buffer of
zeros in place (imports only torch and ``adv_bert``; probe round p).

The recording pairs the model's output with the node that made the buffer, ``new_zeros``,
whose recorded value is the buffer as made, all zeros: ``out[b, :n] = row`` writes into
it later and returns nothing that stands for it. A correct port FAILED by 5.47, the
largest magnitude of MiniLM's hidden states.

- ``correct``: BERT's arithmetic, row by row; the padded positions left at zero (the
  reference's values there are not compared);
- ``faulty``: each row's hidden state scaled by 1 + 1e-3 after layer 3 (1 on bert-tiny).
  It FAILS, named at the pooler's read of the buffer, not in layer 3: the recording
  pairs none of the rows' weighted nodes, and module evidence pairs no module after the
  fault with a row of the reference's values (a row cut to its real tokens, 1e-3 off).
"""

from __future__ import annotations

from typing import Any

import adv_bert
import torch


class PaddedInPlace(adv_bert.Bert):
    fault = -1  # the layer after which each row is scaled by 1 + 1e-3 (-1: none)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        B, S = input_ids.shape
        out = None
        for b in range(B):
            n = int(attention_mask[b].sum())
            x = self.embed(input_ids[b:b + 1, :n], token_type_ids[b:b + 1, :n])
            keep = torch.ones(1, 1, 1, n, dtype=torch.bool)
            for block in self.blocks:
                x = block(x, keep)
                if block.index == self.fault:
                    x = x * (1.0 + 1e-3)
            if out is None:
                out = x.new_zeros(B, S, x.shape[-1])
            out[b, :n] = x[0]
        assert out is not None
        return {"last_hidden_state": out, "pooler_output": torch.tanh(self.pool(out[:, 0]))}


def correct(reference: Any) -> PaddedInPlace:
    return adv_bert.load(PaddedInPlace(reference.config), reference)


def faulty(reference: Any) -> PaddedInPlace:
    model = correct(reference)
    model.fault = adv_bert.fault_layer(reference)
    return model
