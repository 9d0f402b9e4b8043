"""The plain BERT every adversarial port builds on (imports only torch).

Each port file in this folder subclasses ``Block`` (or patches, hooks or configures it)
so that ONE layer takes a faulty path chosen by a mechanism that a shortcut (a cached or
replayed graph, a skipped hook) could miss, and exposes two builders: ``faulty`` and
``correct``, its twin, the same code selecting the clean path. A builder takes what
``introspect diff --candidate FILE.py:NAME`` passes (``.model``, ``.config``) and returns
the port holding the reference's weights, loaded through an explicit key mapping.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def fault_layer(reference: Any) -> int:
    """The layer a fault goes into: 1 on bert-tiny (2 layers), 3 on deeper models."""
    return 1 if reference.config.num_hidden_layers <= 2 else 3


class Embeddings(nn.Module):
    def __init__(self, vocab: int, positions: int, segments: int, hidden: int,
                 eps: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(positions, hidden)
        self.seg = nn.Embedding(segments, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (S,)
        x = self.tok(input_ids) + self.seg(token_type_ids) + self.pos(positions)  # (B, S, H)
        return self.norm(x)


class Block(nn.Module):
    """One post-LN encoder layer; ``activation`` and ``scale`` are the points ports vary."""

    def __init__(self, index: int, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.index = index
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        return x.view(B, S, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, S, hd)

    def scale(self) -> float:
        return 1 / math.sqrt(self.head_dim)

    def attend(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = q @ k.transpose(-1, -2) * self.scale()  # (B, nh, S, S)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        y = scores.softmax(-1) @ v  # (B, nh, S, hd)
        return y.transpose(1, 2).reshape(B, S, H)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h)  # the exact (erf) GELU, as BERT

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        return self.norm2(x + self.ffn_out(self.activation(self.ffn_in(x))))


class TanhBlock(Block):
    """The faulty twin's usual fault: the tanh approximation of GELU."""

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate="tanh")


class Bert(nn.Module):
    def __init__(self, config: Any, block: Any = Block) -> None:
        super().__init__()
        c = config
        self.embed = Embeddings(c.vocab_size, c.max_position_embeddings, c.type_vocab_size,
                                c.hidden_size, c.layer_norm_eps)
        self.blocks = nn.ModuleList(
            block(i, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                  c.layer_norm_eps) for i in range(c.num_hidden_layers))
        self.pool = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S)
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


FIXED = {"embed.tok": "embeddings.word_embeddings",
         "embed.pos": "embeddings.position_embeddings",
         "embed.seg": "embeddings.token_type_embeddings",
         "embed.norm": "embeddings.LayerNorm", "pool": "pooler.dense"}
IN_BLOCK = {"q": "attention.self.query", "k": "attention.self.key",
            "v": "attention.self.value", "proj": "attention.output.dense",
            "norm1": "attention.output.LayerNorm", "ffn_in": "intermediate.dense",
            "ffn_out": "output.dense", "norm2": "output.LayerNorm"}


def hf_key(key: str) -> str:
    """This port's parameter name -> HF BertModel's."""
    module, _, leaf = key.rpartition(".")
    if module in FIXED:
        return f"{FIXED[module]}.{leaf}"
    _, index, part = module.split(".")  # blocks.1.ffn_in
    return f"encoder.layer.{index}.{IN_BLOCK[part]}.{leaf}"


def load(model: nn.Module, reference: Any) -> nn.Module:
    """Copy the reference's weights in (copies: the reference is never shared or touched)."""
    weights = reference.model.state_dict()
    state = {}
    for key, mine in model.state_dict().items():
        theirs = weights[hf_key(key)]
        if theirs.shape != mine.shape:
            raise ValueError(f"{key}: {tuple(theirs.shape)} != {tuple(mine.shape)}")
        state[key] = theirs.detach().clone()
    model.load_state_dict(state)
    return model.eval()


def tanh_in_fault_layer(model: Bert, reference: Any) -> Bert:
    """``model`` with the block of ``fault_layer`` replaced by a ``TanhBlock`` holding its
    weights (a port that computes around its blocks keeps its own code)."""
    layer = fault_layer(reference)
    c = reference.config
    tanh = TanhBlock(layer, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                     c.layer_norm_eps)
    tanh.load_state_dict(model.blocks[layer].state_dict())
    model.blocks[layer] = tanh.eval()
    return model


def build(reference: Any, block: Any = Block) -> Bert:
    if type(reference.model).__name__ != "BertModel":
        raise ValueError("these ports are bare encoders; diff them with --head base")
    return load(Bert(reference.config, block), reference)
