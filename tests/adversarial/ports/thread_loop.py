"""BERT whose layer loop runs in a worker thread (``concurrent.futures``, one worker;
imports only torch and ``adv_bert``; probe round o).

Module evidence judges each layer, called in the thread, on the reference's inputs to it;
the code of the loop between two layers ran there too, where the recording does not
reach, and a layer's output scaled by 1 + 1e-4 before the next took it passed on the
outputs' budget. What the code between two layers hands on is held to what the first
returned (``modules.handed_on``), in a worker thread too.

- ``correct``: BERT's arithmetic;
- ``faulty``: the hidden state scaled by 1 + 2e-5 (under the outputs' budget) after layer
  ``adv_bert.fault_layer - 1``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import adv_bert
import torch

_POOL = ThreadPoolExecutor(max_workers=1)


class ThreadLoopBert(adv_bert.Bert):
    gain = 1.0
    after = 0

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        def loop(x: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                for i, block in enumerate(self.blocks):
                    x = block(x, mask)
                    if i == self.after:
                        x = x * self.gain
                return x

        x = _POOL.submit(loop, x).result()
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def _build(reference: Any, gain: float) -> ThreadLoopBert:
    model = adv_bert.load(ThreadLoopBert(reference.config), reference)
    model.gain, model.after = gain, adv_bert.fault_layer(reference) - 1
    return model


def correct(reference: Any) -> ThreadLoopBert:
    return _build(reference, 1.0)


def faulty(reference: Any) -> ThreadLoopBert:
    return _build(reference, 1.0 + 2e-5)
