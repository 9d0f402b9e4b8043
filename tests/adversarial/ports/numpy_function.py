"""LayerNorms computed in NumPy inside a custom ``autograd.Function`` with a NumPy backward
(imports only torch, NumPy and ``adv_bert``), called inline, not as modules.

The recording sees the ops a Function's forward runs, but NumPy's are none of them: each
LayerNorm's output entered it as a constant, so nothing after the first one was paired
(0 pairs), and a fault under the outputs' budget (an eps of 1e-5 for 1e-12) passed where
no module held it alone. A Function whose outputs come from no recorded op on its inputs
is now one opaque node of the recording, run again by the replay.

- ``correct``: BERT's LayerNorm, in float64 then rounded to float32;
- ``faulty``: layer 1's first LayerNorm with eps 1e-5;
- ``faulty_backward``: layer 1's first LayerNorm's backward leaves out the gain (the
  forward is the same).
"""

from __future__ import annotations

import adv_bert
import numpy as np
import torch


class NumpyLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gain, shift, eps, gained):
        values = x.detach().numpy().astype(np.float64)
        centred = values - values.mean(-1, keepdims=True)
        deviation = np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps)
        normed = centred / deviation
        ctx.save_for_backward(torch.from_numpy(normed), torch.from_numpy(deviation), gain)
        ctx.gained = gained
        out = normed * gain.detach().numpy().astype(np.float64) + shift.detach().numpy()
        return torch.from_numpy(out.astype(np.float32))

    @staticmethod
    def backward(ctx, grad):
        normed, deviation, gain = ctx.saved_tensors
        normed, deviation = normed.numpy(), deviation.numpy()
        g = grad.detach().numpy().astype(np.float64)
        scaled = g * gain.detach().numpy().astype(np.float64) if ctx.gained else g
        dx = (scaled - scaled.mean(-1, keepdims=True)
              - normed * (scaled * normed).mean(-1, keepdims=True)) / deviation
        rows = tuple(range(g.ndim - 1))

        def back(a):
            return torch.from_numpy(np.ascontiguousarray(a).astype(np.float32))

        return back(dx), back((g * normed).sum(rows)), back(g.sum(rows)), None, None


class NumpyBlock(adv_bert.Block):
    fault = ""

    def norm(self, which, x):
        norm = getattr(self, which)
        first = which == "norm1" and self.index == 1
        eps = 1e-5 if first and self.fault == "eps" else norm.eps
        gained = not (first and self.fault == "backward")
        return NumpyLayerNorm.apply(x, norm.weight, norm.bias, eps, gained)

    def forward(self, x, mask):
        x = self.norm("norm1", x + self.proj(self.attend(x, mask)))
        return self.norm("norm2", x + self.ffn_out(self.activation(self.ffn_in(x))))


def _build(reference, fault=""):
    model = adv_bert.build(reference, NumpyBlock)
    for block in model.blocks:
        block.fault = fault
    return model


def correct(reference):
    return _build(reference)


def faulty(reference):
    return _build(reference, "eps")


def faulty_backward(reference):
    return _build(reference, "backward")
