"""BERT with every layer's weights stacked along a leading layer axis, run by a loop over
the layer index, as ports from JAX/Flax scans are (imports only torch).

The position table is a raw ``Parameter`` sliced, never called: the only weights no
judged module holds that relate one to one to a reference module. The stacked ones
relate to no single reference weight. A slip in one layer's attention LayerNorm was
named at the position embeddings, the one module owning every unjudged weight.

- ``correct``: BERT's arithmetic;
- ``faulty``: layer ``slip_layer``'s attention LayerNorm with eps 1e-5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_STACKED = {  # this port's stacked parameter -> the reference's per-layer weight
    "wq": "attention.self.query.weight", "bq": "attention.self.query.bias",
    "wk": "attention.self.key.weight", "bk": "attention.self.key.bias",
    "wv": "attention.self.value.weight", "bv": "attention.self.value.bias",
    "wo": "attention.output.dense.weight", "bo": "attention.output.dense.bias",
    "ln1_w": "attention.output.LayerNorm.weight", "ln1_b": "attention.output.LayerNorm.bias",
    "w_in": "intermediate.dense.weight", "b_in": "intermediate.dense.bias",
    "w_out": "output.dense.weight", "b_out": "output.dense.bias",
    "ln2_w": "output.LayerNorm.weight", "ln2_b": "output.LayerNorm.bias",
}


def slip_layer(reference):
    return 1 if reference.config.num_hidden_layers <= 2 else 3


class ScanBert(nn.Module):
    def __init__(self, reference, slipped=None):
        super().__init__()
        config, weights = reference.config, reference.model.state_dict()
        self.heads, self.eps, self.slipped = config.num_attention_heads, \
            config.layer_norm_eps, slipped
        self.words = nn.Embedding.from_pretrained(
            weights["embeddings.word_embeddings.weight"].clone(), freeze=False)
        self.segments = nn.Embedding.from_pretrained(
            weights["embeddings.token_type_embeddings.weight"].clone(), freeze=False)
        self.positions = nn.Parameter(weights["embeddings.position_embeddings.weight"].clone())
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.norm.load_state_dict({"weight": weights["embeddings.LayerNorm.weight"],
                                   "bias": weights["embeddings.LayerNorm.bias"]})
        layers = range(config.num_hidden_layers)
        for mine, theirs in _STACKED.items():
            stacked = torch.stack([weights[f"encoder.layer.{i}.{theirs}"] for i in layers])
            setattr(self, mine, nn.Parameter(stacked.clone()))
        self.pool = nn.Linear(config.hidden_size, config.hidden_size)
        self.pool.load_state_dict({"weight": weights["pooler.dense.weight"],
                                   "bias": weights["pooler.dense.bias"]})

    def _heads(self, t):
        b, s, h = t.shape
        return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

    def _layer(self, i, x, keep):
        b, s, h = x.shape
        q, k, v = (self._heads(F.linear(x, w[i], bias[i])) for w, bias in
                   ((self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv)))
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        mixed = mixed.transpose(1, 2).reshape(b, s, h)
        eps = 1e-5 if i == self.slipped else self.eps
        x = F.layer_norm(x + F.linear(mixed, self.wo[i], self.bo[i]), (h,), self.ln1_w[i],
                         self.ln1_b[i], eps)
        inner = F.gelu(F.linear(x, self.w_in[i], self.b_in[i]))
        return F.layer_norm(x + F.linear(inner, self.w_out[i], self.b_out[i]), (h,),
                            self.ln2_w[i], self.ln2_b[i], self.eps)

    def forward(self, input_ids, token_type_ids, attention_mask):
        length = input_ids.shape[1]
        x = self.norm(self.words(input_ids) + self.segments(token_type_ids)
                      + self.positions[:length])
        keep = attention_mask[:, None, None, :].bool()
        for i in range(self.wq.shape[0]):
            x = self._layer(i, x, keep)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference):
    return ScanBert(reference).eval()


def faulty(reference):
    return ScanBert(reference, slip_layer(reference)).eval()


def _slipped(reference, slips):
    """The port with each (layer, stacked weight) of ``slips`` read from another layer's
    slice, as a loader with an off-by-one does."""
    model = ScanBert(reference)
    with torch.no_grad():
        for (layer, name), source in slips.items():
            getattr(model, name)[layer].copy_(getattr(model, name)[source])
    return model.eval()


def wo_from_layer_before(reference):
    return _slipped(reference, {(2, "wo"): 1})


def layer_copied_from_layer_before(reference):
    return _slipped(reference, {(1, name): 0 for name in _STACKED})
