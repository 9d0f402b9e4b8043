"""BERT on ``nn.TransformerEncoder``, as people write it from PyTorch's own layers (imports
only torch). In eval under ``no_grad`` PyTorch runs each layer as one fused kernel (the
"fast path") that reads ``linear1.weight`` itself and never calls ``linear1.forward``; with
autograd on, or under any torch function mode, it runs the layer's Python code.

- ``correct``: the reference's weights, plain layers;
- ``faulty``: layer 1's ``linear1`` holds a LoRA delta merged into its weight and takes it
  back out in its own forward (``W + BA`` stored, ``x (W + BA - BA)^T`` computed): right on
  the slow path, off by the delta on the fast path a user's ``no_grad`` call takes;
- ``faulty_tanh``: layer 1's activation is ``nn.GELU(approximate="tanh")``: the fast path
  runs the erf GELU anyway, the slow path (autograd on) the tanh one.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class MergedLoRALinear(nn.Linear):
    """A Linear whose stored weight has a LoRA delta merged in, taken out in forward."""

    def __init__(self, base: nn.Linear, rank: int = 4, seed: int = 0) -> None:
        super().__init__(base.in_features, base.out_features)
        g = torch.Generator().manual_seed(seed)
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(base.out_features, rank, generator=g) * 0.1)
        with torch.no_grad():
            self.weight.copy_(base.weight + self.lora_b @ self.lora_a)  # merged
            self.bias.copy_(base.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight - self.lora_b @ self.lora_a, self.bias)


class EncoderBert(nn.Module):
    def __init__(self, c: Any) -> None:
        super().__init__()
        H = c.hidden_size
        self.tok = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.seg = nn.Embedding(c.type_vocab_size, H)
        self.norm = nn.LayerNorm(H, eps=c.layer_norm_eps)
        layer = nn.TransformerEncoderLayer(H, c.num_attention_heads, c.intermediate_size,
                                           dropout=0.0, activation="gelu",
                                           layer_norm_eps=c.layer_norm_eps, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, c.num_hidden_layers,
                                             enable_nested_tensor=False)
        self.pool = nn.Linear(H, H)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1])
        x = self.norm(self.tok(input_ids) + self.seg(token_type_ids) + self.pos(positions))
        x = self.encoder(x, src_key_padding_mask=attention_mask == 0)  # (B, S, H)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def _load(reference: Any) -> EncoderBert:
    model = EncoderBert(reference.config)
    w = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
    state = {"tok.weight": w["embeddings.word_embeddings.weight"],
             "pos.weight": w["embeddings.position_embeddings.weight"],
             "seg.weight": w["embeddings.token_type_embeddings.weight"],
             "norm.weight": w["embeddings.LayerNorm.weight"],
             "norm.bias": w["embeddings.LayerNorm.bias"],
             "pool.weight": w["pooler.dense.weight"], "pool.bias": w["pooler.dense.bias"]}
    for i in range(reference.config.num_hidden_layers):
        hf, me = f"encoder.layer.{i}.", f"encoder.layers.{i}."
        qkv = ("query", "key", "value")
        state[me + "self_attn.in_proj_weight"] = torch.cat(
            [w[f"{hf}attention.self.{n}.weight"] for n in qkv])
        state[me + "self_attn.in_proj_bias"] = torch.cat(
            [w[f"{hf}attention.self.{n}.bias"] for n in qkv])
        for mine, theirs in (("self_attn.out_proj", "attention.output.dense"),
                             ("linear1", "intermediate.dense"), ("linear2", "output.dense"),
                             ("norm1", "attention.output.LayerNorm"),
                             ("norm2", "output.LayerNorm")):
            for leaf in ("weight", "bias"):
                state[f"{me}{mine}.{leaf}"] = w[f"{hf}{theirs}.{leaf}"]
    model.load_state_dict(state)
    return model.eval()


def correct(reference: Any) -> EncoderBert:
    return _load(reference)


def faulty(reference: Any) -> EncoderBert:
    model = _load(reference)
    layer = model.encoder.layers[1]
    layer.linear1 = MergedLoRALinear(layer.linear1)
    return model


def faulty_tanh(reference: Any) -> EncoderBert:
    model = _load(reference)
    model.encoder.layers[1].activation = nn.GELU(approximate="tanh")
    return model
