"""BERT written as functions over a dict of weights, one layer run in a worker thread:
the recording sees that layer only as the value it hands the next one back, and no module
of the port's own holds it. ``faulty`` gives that layer's output LayerNorm an eps of 1e-5
(the model's is 1e-12)."""

import math
import threading

import torch
import torch.nn.functional as F
from torch import nn


def _layer(w, p, x, mask, heads, eps, out_eps):
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
    x = F.layer_norm(a + x, (H,), w[p + "attention.output.LayerNorm.weight"],
                     w[p + "attention.output.LayerNorm.bias"], eps)
    h = F.gelu(F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
    h = F.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
    return F.layer_norm(h + x, (H,), w[p + "output.LayerNorm.weight"],
                        w[p + "output.LayerNorm.bias"], out_eps)


def _in_a_thread(fn, *args):
    box = {}
    grad = torch.is_grad_enabled()

    def work():
        with torch.set_grad_enabled(grad):
            box["out"] = fn(*args)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return box["out"]


class ThreadedLayerBert(nn.Module):
    def __init__(self, reference, threaded, out_eps=None):
        super().__init__()
        c = reference.config
        self.heads, self.eps, self.layers = c.num_attention_heads, c.layer_norm_eps, \
            c.num_hidden_layers
        self.threaded, self.out_eps = threaded, out_eps
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(v.detach().clone())
                                   for k, v in reference.model.state_dict().items()
                                   if v.is_floating_point()})

    def forward(self, input_ids, token_type_ids, attention_mask):
        w = {k.replace("__", "."): v for k, v in self.w.items()}
        S = input_ids.shape[1]
        x = (w["embeddings.word_embeddings.weight"][input_ids]
             + w["embeddings.position_embeddings.weight"][:S]
             + w["embeddings.token_type_embeddings.weight"][token_type_ids])
        x = F.layer_norm(x, (x.shape[-1],), w["embeddings.LayerNorm.weight"],
                         w["embeddings.LayerNorm.bias"], self.eps)
        mask = attention_mask[:, None, None, :].bool()
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            if i == self.threaded:
                out_eps = self.eps if self.out_eps is None else self.out_eps
                x = _in_a_thread(_layer, w, p, x, mask, self.heads, self.eps, out_eps)
            else:
                x = _layer(w, p, x, mask, self.heads, self.eps, self.eps)
        pooled = torch.tanh(F.linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
        return {"last_hidden_state": x, "pooler_output": pooled}


def threaded_layer(reference):
    return 1 if reference.config.num_hidden_layers <= 3 else 2


def correct(reference):
    return ThreadedLayerBert(reference, threaded_layer(reference)).eval()


def faulty(reference):
    return ThreadedLayerBert(reference, threaded_layer(reference), out_eps=1e-5).eval()
