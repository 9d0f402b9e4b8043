"""BERT that runs its sequence back to front and turns its outputs round at the end
(imports only torch and ``adv_bert``; probe round s). Attention does not care about the
order of its keys, so every value is BERT's, each token at the mirrored place: the
position table is read back to front to match, and the pooler reads the last token.

- ``correct``: BERT's arithmetic, the sequence reversed and back;
- ``faulty``: the same, layer 3's GELU (1's on bert-tiny) the tanh one;
- ``faulty_numpy``: layer 3's output LayerNorm computed in NumPy with eps 1e-5, under the
  outputs' budget, where the recording does not see it: the whole models' float64 check
  fails it, and found where the runs part by the tokens in the reference's order (it
  named the embeddings).
"""

from __future__ import annotations

from typing import Any

import adv_bert
import numpy as np
import torch
from torch import nn


class MirroredEmbeddings(adv_bert.Embeddings):
    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1] - 1, -1, -1)  # the last token at 0
        x = self.tok(input_ids) + self.seg(token_type_ids) + self.pos(positions)
        return self.norm(x)


class NumpyNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().numpy()
        mean = a.mean(-1, keepdims=True)
        var = ((a - mean) ** 2).mean(-1, keepdims=True)
        y = (a - mean) / np.sqrt(var + self.eps) * self.weight.detach().numpy() \
            + self.bias.detach().numpy()
        return torch.from_numpy(y.astype(np.float32))


class FlippedSequence(adv_bert.Bert):
    def __init__(self, config: Any, block: Any = adv_bert.Block) -> None:
        super().__init__(config, block)
        c = config
        self.embed = MirroredEmbeddings(c.vocab_size, c.max_position_embeddings,
                                        c.type_vocab_size, c.hidden_size, c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask.flip(1)[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(input_ids.flip(1), token_type_ids.flip(1))
        for block in self.blocks:
            x = block(x, mask)
        return {"last_hidden_state": x.flip(1),
                "pooler_output": torch.tanh(self.pool(x[:, -1]))}


def correct(reference: Any) -> FlippedSequence:
    return adv_bert.load(FlippedSequence(reference.config), reference)


def faulty(reference: Any) -> FlippedSequence:
    return adv_bert.tanh_in_fault_layer(correct(reference), reference)


def faulty_numpy(reference: Any) -> FlippedSequence:
    model = correct(reference)
    block = model.blocks[adv_bert.fault_layer(reference)]
    norm = NumpyNorm(block.norm2.normalized_shape, eps=1e-5)
    norm.load_state_dict(block.norm2.state_dict())
    block.norm2 = norm.eval()
    return model
