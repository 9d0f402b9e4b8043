"""A masked-LM BERT written the way a user might (imports only torch; probe round q):
one fused Linear for key, query and value (in that order), modules of its own names.

On a random-init checkpoint every bias is zero, so the fused bias's three blocks each
equal every reference bias by value: the query's bias was related to the key's block,
its gradient read from there, and ``--backward`` FAILED a correct port on four biases.
``permuted_ffn`` runs each FFN's hidden units in another order (the input Linear's rows
and bias, the output Linear's columns): its zero bias's order is the weight's.

- ``build``, ``permuted_ffn``: correct;
- ``faulty``, ``permuted_ffn_faulty``: the last layer's GELU is the tanh one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.nh = c.num_attention_heads
        self.kqv = nn.Linear(H, 3 * H)
        self.o = nn.Linear(H, H)
        self.ln1 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.up = nn.Linear(H, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, H)
        self.ln2 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.gelu = "erf"

    def forward(self, x, keep):
        B, S, H = x.shape
        k, q, v = self.kqv(x).split(H, -1)

        def sh(t):
            return t.view(B, S, self.nh, -1).transpose(1, 2)  # (B, nh, S, hd)

        att = (sh(q) @ sh(k).transpose(-1, -2)) / math.sqrt(H // self.nh)
        att = att.masked_fill(~keep, float("-inf")).softmax(-1)
        y = (att @ sh(v)).transpose(1, 2).reshape(B, S, H)
        x = self.ln1(x + self.o(y))
        h = self.up(x)
        h = F.gelu(h, approximate="tanh") if self.gelu == "tanh" else F.gelu(h)
        return self.ln2(x + self.down(h))


class MLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.tok = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.typ = nn.Embedding(c.type_vocab_size, H)
        self.ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.t_dense = nn.Linear(H, H)
        self.t_ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.out_bias = nn.Parameter(torch.zeros(c.vocab_size))

    def forward(self, input_ids, token_type_ids, attention_mask):
        S = input_ids.shape[1]
        x = self.ln(self.tok(input_ids) + self.typ(token_type_ids) + self.pos.weight[:S])
        keep = attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        t = self.t_ln(F.gelu(self.t_dense(x)))
        return (t @ self.tok.weight.T + self.out_bias,)


def build(reference):
    m = MLM(reference.config)
    s = reference.model.state_dict()
    new = {"tok.weight": s["bert.embeddings.word_embeddings.weight"],
           "pos.weight": s["bert.embeddings.position_embeddings.weight"],
           "typ.weight": s["bert.embeddings.token_type_embeddings.weight"],
           "ln.weight": s["bert.embeddings.LayerNorm.weight"],
           "ln.bias": s["bert.embeddings.LayerNorm.bias"],
           "t_dense.weight": s["cls.predictions.transform.dense.weight"],
           "t_dense.bias": s["cls.predictions.transform.dense.bias"],
           "t_ln.weight": s["cls.predictions.transform.LayerNorm.weight"],
           "t_ln.bias": s["cls.predictions.transform.LayerNorm.bias"],
           "out_bias": s["cls.predictions.bias"]}
    for i in range(len(m.layers)):
        p = f"bert.encoder.layer.{i}."
        a = p + "attention.self."
        for leaf in ("weight", "bias"):
            new[f"layers.{i}.kqv.{leaf}"] = torch.cat(
                [s[f"{a}{n}.{leaf}"] for n in ("key", "query", "value")])
        for mine, theirs in (("o", "attention.output.dense"), ("ln1", "attention.output.LayerNorm"),
                             ("up", "intermediate.dense"), ("down", "output.dense"),
                             ("ln2", "output.LayerNorm")):
            for leaf in ("weight", "bias"):
                new[f"layers.{i}.{mine}.{leaf}"] = s[p + theirs + "." + leaf]
    m.load_state_dict({k: v.detach().clone() for k, v in new.items()})
    return m.eval()


def faulty(reference):
    m = build(reference)
    m.layers[-1].gelu = "tanh"
    return m


def permuted_ffn(reference):
    """The FFN's hidden units in another order: up's rows and down's columns permuted."""
    m = build(reference)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in m.layers:
            order = torch.randperm(layer.up.out_features, generator=g)
            layer.up.weight.copy_(layer.up.weight[order])
            layer.up.bias.copy_(layer.up.bias[order])
            layer.down.weight.copy_(layer.down.weight[:, order])
    return m


def permuted_ffn_faulty(reference):
    m = permuted_ffn(reference)
    m.layers[-1].gelu = "tanh"
    return m
