"""Forwards whose values depend on how many times, or with which random state, they ran
(imports only torch and ``adv_bert``). Faults sit in layer 1.

- ``*_third``: tanh GELU on every 3rd call;
- ``*_fourth``: tanh GELU on every 4th call;
- ``*_first``: tanh GELU on the first call only;
- ``*_lazy``: a position table built lazily on the first call (the faulty one rounds it
  through float16);
- ``*_dropout``: ``F.dropout(h, 0.1, training=True)`` left in layer 1 (no seed), the
  correct one passes ``training=self.training``;
- ``*_seeded``: ``torch.manual_seed(0)`` in the forward before that dropout: the same
  mask on every call, still wrong.
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F


class CountingBlock(adv_bert.Block):
    every = 0  # 0: never wrong
    first_only = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def activation(self, h):
        self.calls += 1
        wrong = (self.every and self.calls % self.every == 0) or \
            (self.first_only and self.calls == 1)
        return F.gelu(h, approximate="tanh" if self.index == 1 and wrong else "none")


def _counting(reference, every=0, first_only=False):
    model = adv_bert.build(reference, CountingBlock)
    for block in model.blocks:
        block.every, block.first_only = every, first_only
    return model


def correct_third(reference):
    return _counting(reference)


def faulty_third(reference):
    return _counting(reference, every=3)


def correct_fourth(reference):
    return _counting(reference)


def faulty_fourth(reference):
    return _counting(reference, every=4)


def correct_first(reference):
    return _counting(reference)


def faulty_first(reference):
    return _counting(reference, first_only=True)


class LazyEmbeddings(adv_bert.Embeddings):
    half = False

    def forward(self, input_ids, token_type_ids):
        if not hasattr(self, "table"):  # built on the first call, kept as a buffer
            table = self.pos.weight.detach().clone()
            if self.half:
                table = table.half().float()
            self.register_buffer("table", table, persistent=False)
        x = self.tok(input_ids) + self.seg(token_type_ids) + self.table[: input_ids.shape[1]]
        return self.norm(x)


def _lazy(reference, half):
    model = adv_bert.build(reference)
    lazy = LazyEmbeddings.__new__(LazyEmbeddings)
    lazy.__dict__.update(model.embed.__dict__)
    lazy.half = half
    model.embed = lazy
    return model


def correct_lazy(reference):
    return _lazy(reference, False)


def faulty_lazy(reference):
    return _lazy(reference, True)


class DropoutBlock(adv_bert.Block):
    always = False
    seed = False

    def activation(self, h):
        h = F.gelu(h)
        if self.index == 1:
            if self.seed:
                torch.manual_seed(0)
            h = F.dropout(h, 0.1, training=True if self.always else self.training)
        return h


def _dropout(reference, always, seed=False):
    model = adv_bert.build(reference, DropoutBlock)
    for block in model.blocks:
        block.always, block.seed = always, seed
    return model


def correct_dropout(reference):
    return _dropout(reference, False)


def faulty_dropout(reference):
    return _dropout(reference, True)


def correct_seeded(reference):
    return _dropout(reference, False, seed=True)


def faulty_seeded(reference):
    return _dropout(reference, True, seed=True)
