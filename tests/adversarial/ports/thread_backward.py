"""BERT with one layer run in a worker thread, and a query projection whose backward
hands its input the gradient through the weight transposed (imports only torch and
``adv_bert``).

The recording follows only the caller's thread, so the gradients are judged from each
side's own backward. The projection computes the same forward and moves the gradients of
every weight before it: the nearest the loss of those is the previous layer's.

- ``correct``: the threaded layer, every projection plain;
- ``faulty_before``: the query projection of the layer before the threaded one;
- ``faulty_inside``: the query projection of the threaded layer.
"""

from __future__ import annotations

import concurrent.futures

import adv_bert
import torch
from torch import nn


class _TransposedBackward(torch.autograd.Function):
    """``x @ w.T + b``, exact forward; its backward hands ``x`` ``g @ w.T`` (the weight
    transposed: the shapes agree for a square projection)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        rows = tuple(range(grad.dim() - 1))
        flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        return grad @ weight.t(), flat_grad.t() @ flat_x, grad.sum(rows)


class SlipLinear(nn.Linear):
    def forward(self, x):
        return _TransposedBackward.apply(x, self.weight, self.bias)


class ThreadedBert(adv_bert.Bert):
    threaded = 1

    def forward(self, input_ids, token_type_ids, attention_mask):
        mask = attention_mask[:, None, None, :].bool()
        grad = torch.is_grad_enabled()
        x = self.embed(input_ids, token_type_ids)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            for i, block in enumerate(self.blocks):
                if i == self.threaded:
                    def job(x=x, block=block):
                        with torch.set_grad_enabled(grad):
                            return block(x, mask)
                    x = pool.submit(job).result()
                else:
                    x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def threaded_layer(reference):
    return adv_bert.fault_layer(reference)


def _build(reference, slipped=None):
    model = ThreadedBert(reference.config)
    model.threaded = threaded_layer(reference)
    if slipped is not None:
        old = model.blocks[slipped].q
        model.blocks[slipped].q = SlipLinear(old.in_features, old.out_features)
    return adv_bert.load(model, reference)


def correct(reference):
    return _build(reference)


def faulty_before(reference):
    return _build(reference, threaded_layer(reference) - 1)


def faulty_inside(reference):
    return _build(reference, threaded_layer(reference))
