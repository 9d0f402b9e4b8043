"""BERT written as functions over a dict of weights (no module of its own but the model),
each layer mapped over the batch rows by ``torch.func.vmap``: module evidence has nothing
inside it to judge, and the recording cannot follow ``vmap``. ``faulty`` scales layer N's
attention residual by 1.00003, a slip under the outputs' budget."""

import math

import torch
import torch.nn.functional as F
from torch import nn


def _layer(w, p, x, mask, heads, eps, residual_scale):
    B, S, H = x.shape
    hd = H // heads

    def split(t):
        return t.view(B, S, heads, hd).transpose(1, 2)

    q = split(F.linear(x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"]))
    k = split(F.linear(x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"]))
    v = split(F.linear(x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"]))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)
    a = F.linear(a, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
    x = F.layer_norm(a + x * residual_scale, (H,), w[p + "attention.output.LayerNorm.weight"],
                     w[p + "attention.output.LayerNorm.bias"], eps)
    h = F.gelu(F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
    h = F.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
    return F.layer_norm(h + x, (H,), w[p + "output.LayerNorm.weight"],
                        w[p + "output.LayerNorm.bias"], eps)


class FunctionalBert(nn.Module):
    def __init__(self, reference, slip_layer=None):
        super().__init__()
        c = reference.config
        self.heads, self.eps, self.layers = c.num_attention_heads, c.layer_norm_eps, \
            c.num_hidden_layers
        self.slip_layer = slip_layer
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.detach().clone())
                                   for k, v in reference.model.state_dict().items()
                                   if v.is_floating_point()})

    def forward(self, input_ids, token_type_ids, attention_mask):
        w = {k.replace("__", "."): v for k, v in self.w.items()}
        S = input_ids.shape[1]
        x = (w["embeddings.word_embeddings.weight"][input_ids]
             + w["embeddings.position_embeddings.weight"][:S]
             + w["embeddings.token_type_embeddings.weight"][token_type_ids])
        H = x.shape[-1]
        x = F.layer_norm(x, (H,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                         self.eps)
        mask = attention_mask[:, None, None, :].bool()
        for i in range(self.layers):
            scale = 1.00003 if i == self.slip_layer else 1.0
            x = torch.func.vmap(lambda row, keep, p=f"encoder.layer.{i}.", s=scale: _layer(
                w, p, row[None], keep[None], self.heads, self.eps, s)[0])(x, mask)
        pooled = torch.tanh(F.linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
        return {"last_hidden_state": x, "pooler_output": pooled}


def correct(reference):
    return FunctionalBert(reference).eval()


def faulty(reference):
    layers = reference.config.num_hidden_layers
    return FunctionalBert(reference, 1 if layers <= 2 else 3).eval()
