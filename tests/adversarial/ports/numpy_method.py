"""A BERT whose model runs one layer by hand in a method of its own, that layer's output
LayerNorm computed in NumPy float32 from the block's weights: no module call holds the
norm, and the op-level recording sees only what NumPy hands back. ``faulty`` gives that
norm an eps of 1e-5 (the model's is 1e-12), under the outputs' budget. (Imports only
torch, NumPy and ``adv_bert``.)"""

from __future__ import annotations

import adv_bert
import numpy as np
import torch


def numpy_layer_norm(x, weight, bias, eps):
    a = x.detach().cpu().numpy().astype(np.float32)
    centred = a - a.mean(-1, keepdims=True)
    y = centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + np.float32(eps))
    y = y * weight.detach().numpy() + bias.detach().numpy()
    return torch.from_numpy(y.astype(np.float32))


class ByHandBert(adv_bert.Bert):
    by_hand: int | None = None
    numpy_eps: float | None = None

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        x = self.embed(input_ids, token_type_ids)
        for i, block in enumerate(self.blocks):
            x = self._layer_by_hand(block, x, mask) if i == self.by_hand else block(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}

    def _layer_by_hand(self, block, x, mask):
        x = block.norm1(x + block.proj(block.attend(x, mask)))
        y = x + block.ffn_out(block.activation(block.ffn_in(x)))
        eps = block.norm2.eps if self.numpy_eps is None else self.numpy_eps
        return numpy_layer_norm(y, block.norm2.weight, block.norm2.bias, eps)


def _build(reference, eps=None):
    model = adv_bert.load(ByHandBert(reference.config), reference)
    model.by_hand = adv_bert.fault_layer(reference)
    model.numpy_eps = eps
    return model.eval()


def correct(reference):
    return _build(reference)


def faulty(reference):
    return _build(reference, eps=1e-5)
