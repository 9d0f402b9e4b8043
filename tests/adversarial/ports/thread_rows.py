"""BERT whose batch rows each go through the whole encoder in a thread of their own, two
threads at once (imports only torch and ``adv_bert``; probe round o).

The recording takes the module calls of both threads as they come, interleaved: its
replay fed one row's value to another's module and failed, and a correct port got exit 2
with a traceback. The replay's failure now leaves the node level empty, and the plain
calls and module evidence decide.

- ``correct``: BERT's arithmetic;
- ``faulty``: the hidden state scaled by 1 + 1e-3 after layer 0 (over the outputs' budget);
- ``faulty_small``: scaled by 1 + 2e-5 there, under the outputs' budget. It passed: what
  code between two modules hands on was compared for a whole batch only, and each row's
  module call here stands for a row of the reference's value.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import adv_bert
import torch

_POOL = ThreadPoolExecutor(max_workers=2)


class RowsBert(adv_bert.Bert):
    gain = 1.0

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        def row(i: int) -> torch.Tensor:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                h = x[i:i + 1]
                for j, block in enumerate(self.blocks):
                    h = block(h, mask[i:i + 1])
                    if j == 0:
                        h = h * self.gain
                return h

        x = torch.cat(list(_POOL.map(row, range(x.shape[0]))))
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference: Any) -> RowsBert:
    return adv_bert.load(RowsBert(reference.config), reference)


def faulty(reference: Any) -> RowsBert:
    model = correct(reference)
    model.gain = 1.0 + 1e-3
    return model


def faulty_small(reference: Any) -> RowsBert:
    model = correct(reference)
    model.gain = 1.0 + 2e-5
    return model
