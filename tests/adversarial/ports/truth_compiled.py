"""Compiled, traced and quantized ports: legal models that must get a verdict (imports
only torch and ``adv_bert``).

- ``correct_compiled`` / ``faulty_compiled``: ``torch.compile(port, backend="eager")``;
  the faulty one takes the tanh GELU in layer 1; ``*_inductor``: the same, compiled by
  inductor;
- ``correct_traced`` / ``faulty_traced``: ``torch.jit.trace`` of the port;
- ``correct_quantized`` / ``faulty_quantized``: ``quantize_dynamic`` int8 Linears; the
  faulty one has no residual around layer 1's FFN (int8 noise is ~1e-2: diff these with
  --atol 0.1).
"""

from __future__ import annotations

import adv_bert
import torch
import torch.nn.functional as F
from torch import nn


class TanhBlock(adv_bert.Block):
    def activation(self, h):
        return F.gelu(h, approximate="tanh" if self.index == 1 else "none")


class NoResidualBlock(adv_bert.Block):
    def forward(self, x, mask):
        if self.index != 1:
            return super().forward(x, mask)
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        return self.norm2(self.ffn_out(self.activation(self.ffn_in(x))))


class TupleBert(adv_bert.Bert):
    """Returns a tuple (tracing takes tensors and tuples)."""

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = super().forward(input_ids, token_type_ids, attention_mask)
        return out["last_hidden_state"], out["pooler_output"]


def _example(reference):
    ids = torch.tensor([[101, 1045, 2293, 102, 0], [101, 2002, 102, 2003, 102]])
    return ids, torch.zeros_like(ids), (ids != 0).long()


def correct_compiled(reference):
    return torch.compile(adv_bert.build(reference), backend="eager")


def faulty_compiled(reference):
    return torch.compile(adv_bert.build(reference, TanhBlock), backend="eager")


def correct_inductor(reference):
    return torch.compile(adv_bert.build(reference))


def faulty_inductor(reference):
    return torch.compile(adv_bert.build(reference, TanhBlock))


def _traced(reference, block):
    model = adv_bert.load(TupleBert(reference.config, block), reference)
    return torch.jit.trace(model, _example(reference), check_trace=False)


def correct_traced(reference):
    return _traced(reference, adv_bert.Block)


def faulty_traced(reference):
    return _traced(reference, TanhBlock)


def correct_quantized(reference):
    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference), {nn.Linear},
                                                   dtype=torch.qint8)


def faulty_quantized(reference):
    return torch.ao.quantization.quantize_dynamic(adv_bert.build(reference, NoResidualBlock),
                                                   {nn.Linear}, dtype=torch.qint8)
