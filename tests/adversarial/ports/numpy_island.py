"""BERT written as functions over a dict of weights, every LayerNorm computed in NumPy in
float32 and handed back as a tensor: no module of its own to judge, and an op-level
recording sees nothing of a norm. ``faulty`` gives layer N's attention LayerNorm an eps
of 1e-5 (the model's is 1e-12), a slip under the outputs' budget; ``faulty_alone`` has
that norm alone in NumPy, the rest in torch."""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def numpy_layer_norm(x, weight, bias, eps):
    """A LayerNorm as a NumPy user writes it, in float32 throughout."""
    a = x.detach().cpu().numpy().astype(np.float32)
    centred = a - a.mean(-1, keepdims=True)
    var = (centred * centred).mean(-1, keepdims=True)
    y = centred / np.sqrt(var + np.float32(eps))
    y = y * weight.detach().cpu().numpy().astype(np.float32) \
        + bias.detach().cpu().numpy().astype(np.float32)
    return torch.from_numpy(y.astype(np.float32))


def torch_layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _layer(w, p, x, mask, heads, eps, attention_eps, norm, attention_norm):
    B, S, H = x.shape
    hd = H // heads

    def heads_of(t):
        return t.view(B, S, heads, hd).transpose(1, 2)

    def project(part):
        return heads_of(F.linear(x, w[p + f"attention.self.{part}.weight"],
                                 w[p + f"attention.self.{part}.bias"]))

    q, k, v = project("query"), project("key"), project("value")
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)
    a = F.linear(a, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
    x = attention_norm(a + x, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], attention_eps)
    h = F.gelu(F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
    h = F.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
    return norm(h + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)


class NumpyNormBert(nn.Module):
    def __init__(self, reference, slip_layer=None, alone=False):
        super().__init__()
        self.alone = alone  # the slipped norm alone in NumPy
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
        norm = torch_layer_norm if self.alone else numpy_layer_norm
        x = norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        mask = attention_mask[:, None, None, :].bool()
        for i in range(self.layers):
            slipped = i == self.slip_layer
            attention_eps = 1e-5 if slipped else self.eps
            x = _layer(w, f"encoder.layer.{i}.", x, mask, self.heads, self.eps, attention_eps,
                       norm, numpy_layer_norm if slipped else norm)
        pooled = torch.tanh(F.linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
        return {"last_hidden_state": x, "pooler_output": pooled}


def correct(reference):
    return NumpyNormBert(reference).eval()


def slip_layer(reference):
    return 1 if reference.config.num_hidden_layers <= 2 else 3


def faulty(reference):
    return NumpyNormBert(reference, slip_layer(reference)).eval()


def faulty_alone(reference):
    return NumpyNormBert(reference, slip_layer(reference), alone=True).eval()
