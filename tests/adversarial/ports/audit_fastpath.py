"""Ports on PyTorch's own attention layers, whose eval ``no_grad`` calls take fused fast
paths (imports only torch).

- ``*_mha``: each layer written by hand around ``nn.MultiheadAttention(batch_first=True)``
  called with ``need_weights=False`` (its fast path); the faulty one takes the tanh GELU
  in layer 1;
- ``*_nested``: ``nn.TransformerEncoder(enable_nested_tensor=True)`` on the padded batch
  (its no_grad outputs are nested tensors, zeros at padding); the faulty one runs layer 1
  pre-LN (``norm_first=True``);
- ``*_callable``: ``nn.TransformerEncoderLayer(activation=F.gelu)``, a callable; the
  faulty one passes a lambda taking the tanh GELU to layer 1 (no fast path then).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class MHALayer(nn.Module):
    def __init__(self, c: Any, tanh: bool) -> None:
        super().__init__()
        H = c.hidden_size
        self.attn = nn.MultiheadAttention(H, c.num_attention_heads, batch_first=True)
        self.norm1 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.up, self.down = nn.Linear(H, c.intermediate_size), nn.Linear(c.intermediate_size, H)
        self.norm2 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.approximate = "tanh" if tanh else "none"

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x, key_padding_mask=padding, need_weights=False)
        x = self.norm1(x + y)
        return self.norm2(x + self.down(F.gelu(self.up(x), approximate=self.approximate)))


class Stem(nn.Module):
    def __init__(self, c: Any) -> None:
        super().__init__()
        H = c.hidden_size
        self.tok = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.seg = nn.Embedding(c.type_vocab_size, H)
        self.norm = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.pool = nn.Linear(H, H)

    def embed(self, input_ids, token_type_ids):
        positions = torch.arange(input_ids.shape[1])
        return self.norm(self.tok(input_ids) + self.seg(token_type_ids) + self.pos(positions))

    def outputs(self, x):
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


class MHABert(Stem):
    def __init__(self, c: Any, tanh_layer: int) -> None:
        super().__init__(c)
        self.layers = nn.ModuleList(MHALayer(c, i == tanh_layer)
                                    for i in range(c.num_hidden_layers))

    def forward(self, input_ids, token_type_ids, attention_mask):
        x = self.embed(input_ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, attention_mask == 0)
        return self.outputs(x)


class EncoderBert(Stem):
    def __init__(self, c: Any, activation: Any = "gelu", nested: bool = False) -> None:
        super().__init__(c)
        layer = nn.TransformerEncoderLayer(c.hidden_size, c.num_attention_heads,
                                           c.intermediate_size, dropout=0.0,
                                           activation=activation,
                                           layer_norm_eps=c.layer_norm_eps, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, c.num_hidden_layers,
                                             enable_nested_tensor=nested)

    def forward(self, input_ids, token_type_ids, attention_mask):
        x = self.encoder(self.embed(input_ids, token_type_ids),
                         src_key_padding_mask=attention_mask == 0)
        return self.outputs(x)


_STEM = {"tok.weight": "embeddings.word_embeddings.weight",
         "pos.weight": "embeddings.position_embeddings.weight",
         "seg.weight": "embeddings.token_type_embeddings.weight",
         "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias",
         "pool.weight": "pooler.dense.weight", "pool.bias": "pooler.dense.bias"}


def _load(model: nn.Module, reference: Any, prefix: str, names: dict[str, str]) -> nn.Module:
    w = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
    state = {mine: w[theirs] for mine, theirs in _STEM.items()}
    for i in range(reference.config.num_hidden_layers):
        hf, me = f"encoder.layer.{i}.", f"{prefix}.{i}."
        qkv = ("query", "key", "value")
        for leaf in ("weight", "bias"):
            state[f"{me}{names['in_proj']}_{leaf}"] = torch.cat(
                [w[f"{hf}attention.self.{n}.{leaf}"] for n in qkv])
            for mine, theirs in ((names["out"], "attention.output.dense"),
                                 (names["up"], "intermediate.dense"),
                                 (names["down"], "output.dense"),
                                 ("norm1", "attention.output.LayerNorm"),
                                 ("norm2", "output.LayerNorm")):
                state[f"{me}{mine}.{leaf}"] = w[f"{hf}{theirs}.{leaf}"]
    model.load_state_dict(state)
    return model.eval()


_MHA = {"in_proj": "attn.in_proj", "out": "attn.out_proj", "up": "up", "down": "down"}
_ENCODER = {"in_proj": "self_attn.in_proj", "out": "self_attn.out_proj", "up": "linear1",
            "down": "linear2"}


def correct_mha(reference):
    return _load(MHABert(reference.config, -1), reference, "layers", _MHA)


def faulty_mha(reference):
    return _load(MHABert(reference.config, 1), reference, "layers", _MHA)


def correct_nested(reference):
    return _load(EncoderBert(reference.config, nested=True), reference, "encoder.layers",
                 _ENCODER)


def faulty_nested(reference):
    model = _load(EncoderBert(reference.config, nested=True), reference, "encoder.layers",
                  _ENCODER)
    model.encoder.layers[1].norm_first = True
    return model


def correct_callable(reference):
    return _load(EncoderBert(reference.config, activation=F.gelu), reference,
                 "encoder.layers", _ENCODER)


def faulty_callable(reference):
    model = _load(EncoderBert(reference.config, activation=F.gelu), reference,
                  "encoder.layers", _ENCODER)
    model.encoder.layers[1].activation = lambda x: F.gelu(x, approximate="tanh")
    model.encoder.layers[1].activation_relu_or_gelu = 0
    return model
