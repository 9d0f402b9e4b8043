"""BERT whose every layer spreads the batch's rows over two worker threads (imports only
torch and ``adv_bert``; probe round p).

In ``faulty`` the worker for row 0 of the fault layer computes that layer by calling its
submodules itself, with a tanh GELU between them (over the outputs' budget): no module
call of that layer's is made for row 0. The FAIL was named ``blocks.0.wq`` with "no
weight of the candidate's blocks.0.q relates to the reference's": where the recording
parts from the plain call was read from module calls numbered in the order two threads
happened to run them, and two runs need not share it.

- ``correct``: BERT's arithmetic, every row's layer a call of the layer;
- ``faulty``: row 0 of layer 3 (1 on bert-tiny) as above.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import adv_bert
import torch
import torch.nn.functional as F


class ThreadLayerRows(adv_bert.Bert):
    fault = -1  # the layer whose row 0 takes the tanh GELU (-1: none)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

        def row(block: adv_bert.Block, h: torch.Tensor, m: torch.Tensor, first: bool,
                ) -> torch.Tensor:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                if not (first and block.index == self.fault):
                    return block(h, m)
                h = block.norm1(h + block.proj(block.attend(h, m)))
                inner = F.gelu(block.ffn_in(h), approximate="tanh")
                return block.norm2(h + block.ffn_out(inner))

        with ThreadPoolExecutor(max_workers=2) as pool:
            for block in self.blocks:
                rows = [pool.submit(row, block, x[i:i + 1], mask[i:i + 1], i == 0)
                        for i in range(x.shape[0])]
                x = torch.cat([r.result() for r in rows])
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference: Any) -> ThreadLayerRows:
    return adv_bert.load(ThreadLayerRows(reference.config), reference)


def faulty(reference: Any) -> ThreadLayerRows:
    model = correct(reference)
    model.fault = adv_bert.fault_layer(reference)
    return model
