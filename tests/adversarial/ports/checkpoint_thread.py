"""BERT whose encoder runs in a worker thread, each layer under a reentrant checkpoint
(imports only torch and ``adv_bert``), as a data-loader-style training loop might run it.

The recording follows only the caller's thread, so the gradients come from each side's
own backward alone. Inside a reentrant checkpoint the layers run without autograd: their
outputs are handed no gradient. Those were compared as zeros, over budget, so the own
backward proved nothing and the run was refused (exit 2).

- ``correct``: BERT's arithmetic;
- ``faulty``: layer 1's attention output reaches the residual detached from its
  projection (the forward is the same; that projection gets no gradient).
"""

from __future__ import annotations

import threading

import adv_bert
import torch
from torch.utils.checkpoint import checkpoint


class CutBlock(adv_bert.Block):
    cut = False

    def forward(self, x, mask):
        mixed = self.proj(self.attend(x, mask))
        if self.cut and self.index == 1:
            mixed = mixed.detach()
        x = self.norm1(x + mixed)
        return self.norm2(x + self.ffn_out(self.activation(self.ffn_in(x))))


class ThreadedBert(adv_bert.Bert):
    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        found = []
        grad = torch.is_grad_enabled()

        def encode(x):
            with torch.set_grad_enabled(grad):
                for block in self.blocks:
                    x = checkpoint(block, x, mask, use_reentrant=True)
                found.append(x)

        worker = threading.Thread(target=encode, args=(self.embed(input_ids, token_type_ids),))
        worker.start()
        worker.join()
        x = found[0]
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def _build(reference, cut):
    model = adv_bert.load(ThreadedBert(reference.config, CutBlock), reference)
    for block in model.blocks:
        block.cut = cut
    return model


def correct(reference):
    return _build(reference, False)


def faulty(reference):
    return _build(reference, True)
