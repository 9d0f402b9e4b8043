"""BERT with one fused ``qkv`` Linear per layer (nanoGPT's ``c_attn``), its encoder in a
worker thread (imports only torch and ``adv_bert``).

The recording follows only the caller's thread, so only each side's own backward judges
the gradients, and the fused weight holds three of the reference's: it was "no one
reference weight alone", the own backward proved nothing, and ``--backward`` was refused.
Each block of its rows is now held to the reference weight it equals.

- ``correct``: BERT's arithmetic;
- ``faulty``: layer 1's value rows of the fused weight get no gradient (its value is
  taken through ``detach``: the forward is the same).
"""

from __future__ import annotations

import threading

import adv_bert
import torch
from torch import nn


class FusedBlock(adv_bert.Block):
    cut = False

    def __init__(self, index, hidden, heads, ffn, eps):
        super().__init__(index, hidden, heads, ffn, eps)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        del self.q, self.k, self.v

    def attend(self, x, mask):
        B, S, H = x.shape
        q, k, v = self.qkv(x).split(H, dim=-1)
        if self.cut and self.index == 1:
            v = v.detach()
        q, k, v = self.split(q), self.split(k), self.split(v)
        scores = (q @ k.transpose(-1, -2) * self.scale()).masked_fill(
            ~mask, torch.finfo(q.dtype).min)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)


class ThreadedBert(adv_bert.Bert):
    def forward(self, input_ids, token_type_ids, attention_mask):
        found = []
        grad = torch.is_grad_enabled()

        def run():
            with torch.set_grad_enabled(grad):
                found.append(super(ThreadedBert, self).forward(input_ids, token_type_ids,
                                                               attention_mask))

        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
        return found[0]


def _build(reference, cut):
    model = ThreadedBert(reference.config, FusedBlock)
    weights = reference.model.state_dict()
    state = {}
    for key in model.state_dict():
        if ".qkv." in key:
            _, index, _, leaf = key.split(".")
            state[key] = torch.cat([weights[f"encoder.layer.{index}.attention.self.{p}.{leaf}"]
                                    for p in ("query", "key", "value")]).clone()
        else:
            state[key] = weights[adv_bert.hf_key(key)].detach().clone()
    model.load_state_dict(state)
    for block in model.blocks:
        block.cut = cut
    return model.eval()


def correct(reference):
    return _build(reference, False)


def faulty(reference):
    return _build(reference, True)
