"""Ports for a PASS without an op-level recording (issue 41, part 6; imports only torch and
the sibling ``adv_bert``). Faults sit in layer 1 and stay under the outputs' budget.

- ``correct_plain``: the plain port with its pooler a module of its own (``Pooled``):
  every value between the judged modules is one of theirs;
- ``correct_bare``: ``adv_bert`` as it is: its pooler's tanh runs in the model's own
  forward, glue that no module evidence judges (its inputs are not the reference's bit
  for bit: its attention is not sdpa), so the full path runs and passes;
- ``faulty_ffn``: the tanh GELU on a quarter of layer 1's FFN units;
- ``faulty_glue``: the model's own forward (no module evidence judges it) scales the
  hidden state after layer 0 by 1 + 1e-4; every module is right;
- ``correct_glue``: the same forward, scaling by 1.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F


class Pooler(torch.nn.Module):
    def __init__(self, dense: torch.nn.Linear) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first))


class Pooled(adv_bert.Bert):
    """``adv_bert.Bert`` whose pooler is a module (as HF's ``BertPooler``)."""

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": self.pooler(x[:, 0])}


def _pooled(reference, block=adv_bert.Block):
    model = adv_bert.load(Pooled(reference.config, block), reference)
    model.pooler = Pooler(model.pool)
    return model


def correct_plain(reference):
    return _pooled(reference)


def correct_bare(reference):
    return adv_bert.build(reference)


class QuarterTanhBlock(adv_bert.Block):
    def activation(self, h):
        if self.index != 1:
            return F.gelu(h)
        cut = h.shape[-1] // 4
        return torch.cat([F.gelu(h[..., :cut], approximate="tanh"), F.gelu(h[..., cut:])], -1)


def faulty_ffn(reference):
    return _pooled(reference, QuarterTanhBlock)


class ScaledBert(Pooled):
    factor = 1.0

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(input_ids, token_type_ids)
        for i, block in enumerate(self.blocks):
            x = block(x, mask)
            if i == 0:
                x = x * self.factor  # glue: between two judged modules
        return {"last_hidden_state": x, "pooler_output": self.pooler(x[:, 0])}


def _scaled(reference, factor):
    model = adv_bert.load(ScaledBert(reference.config), reference)
    model.pooler = Pooler(model.pool)
    model.factor = factor
    return model


def correct_glue(reference):
    return _scaled(reference, 1.0)


def faulty_glue(reference):
    return _scaled(reference, 1.0 + 1e-4)
