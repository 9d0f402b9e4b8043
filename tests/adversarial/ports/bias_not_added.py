"""A BERT encoder written over 2-D token rows, its Linears as ``torch.addmm`` and ``@``
(imports only torch). Each faulty build holds every weight and bias, yet leaves one bias
out of what layer 3 computes, as ``torch.mm`` for ``torch.addmm``, ``x @ w.t()`` for
``F.linear`` or ``F.layer_norm(..., bias=None)`` do:

- ``correct``: every bias added;
- ``ffn_bias_not_added``: the FFN's output projection (``output.dense``);
- ``attention_bias_not_added``: the attention's output projection
  (``attention.output.dense``);
- ``norm_bias_not_added``: the FFN's LayerNorm (``output.LayerNorm``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FAULT_LAYER = 3


def _affine(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """(T, in) rows times w.T, the bias added where given."""
    return x @ w.t() if b is None else torch.addmm(b, x, w.t())


class Rows(nn.Module):
    def __init__(self, state: dict[str, torch.Tensor], config, left_out: str = "") -> None:
        super().__init__()
        self.names: dict[str, str] = {}
        for key, value in state.items():
            mine = key.replace(".", "__")
            self.register_parameter(mine, nn.Parameter(value.detach().clone()))
            self.names[key] = mine
        self.heads, self.eps = config.num_attention_heads, config.layer_norm_eps
        self.layers, self.left_out = config.num_hidden_layers, left_out

    def p(self, key: str) -> torch.Tensor:
        return getattr(self, self.names[key])

    def bias(self, layer: int, key: str) -> torch.Tensor | None:
        if layer == FAULT_LAYER and key == self.left_out:
            return None
        return self.p(f"encoder.layer.{layer}.{key}.bias")

    def forward(self, input_ids, token_type_ids, attention_mask):
        B, S = input_ids.shape
        positions = torch.arange(S)
        x = self.p("embeddings.word_embeddings.weight")[input_ids] \
            + self.p("embeddings.token_type_embeddings.weight")[token_type_ids] \
            + self.p("embeddings.position_embeddings.weight")[positions][None]
        H = x.shape[-1]
        x = F.layer_norm(x, (H,), self.p("embeddings.LayerNorm.weight"),
                         self.p("embeddings.LayerNorm.bias"), self.eps).reshape(B * S, H)
        d = H // self.heads
        blocked = (attention_mask[:, None, None, :] == 0)  # (B, 1, 1, S)
        for i in range(self.layers):
            w = lambda name, i=i: self.p(f"encoder.layer.{i}.{name}.weight")  # noqa: E731
            b = lambda name, i=i: self.p(f"encoder.layer.{i}.{name}.bias")  # noqa: E731
            q, k, v = (_affine(x, w(f"attention.self.{n}"), b(f"attention.self.{n}"))
                       .reshape(B, S, self.heads, d).permute(0, 2, 1, 3)
                       for n in ("query", "key", "value"))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
            context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B * S, H)
            attended = _affine(context, w("attention.output.dense"),
                               self.bias(i, "attention.output.dense"))
            x = F.layer_norm(attended + x, (H,), w("attention.output.LayerNorm"),
                             b("attention.output.LayerNorm"), self.eps)
            hidden = F.gelu(_affine(x, w("intermediate.dense"), b("intermediate.dense")))
            out = _affine(hidden, w("output.dense"), self.bias(i, "output.dense"))
            x = F.layer_norm(out + x, (H,), w("output.LayerNorm"),
                             self.bias(i, "output.LayerNorm"), self.eps)
        x = x.reshape(B, S, H)
        pooled = torch.tanh(_affine(x[:, 0], self.p("pooler.dense.weight"),
                                    self.p("pooler.dense.bias")))
        return {"last_hidden_state": x, "pooler_output": pooled}


def _build(reference, left_out: str = "") -> nn.Module:
    return Rows(reference.model.state_dict(), reference.config, left_out).eval()


def correct(reference):
    return _build(reference)


def ffn_bias_not_added(reference):
    return _build(reference, "output.dense")


def attention_bias_not_added(reference):
    return _build(reference, "attention.output.dense")


def norm_bias_not_added(reference):
    return _build(reference, "output.LayerNorm")
