"""GPT-2 whose blocks are one module each: their norms, attention and MLP as plain
Linears and LayerNorms of the block, no attention module of its own (imports only torch;
probe round o). Loaded from an HF ``GPT2LMHeadModel``; ``build(reference)``.

What enters the module holding a layer's attention is then the block's input, before its
norm: the reference's attention is entered after ``ln_1``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=eps), nn.LayerNorm(width, eps=eps)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(width, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + blocked
        mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.out(mixed)
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class FlatBlocksGPT2(nn.Module):
    def __init__(self, reference: Any) -> None:
        super().__init__()
        c = reference.config
        self.words = nn.Embedding(c.vocab_size, c.n_embd)
        self.positions = nn.Embedding(c.n_positions, c.n_embd)
        self.blocks = nn.ModuleList(Block(c.n_embd, c.n_head, c.layer_norm_epsilon)
                                    for _ in range(c.n_layer))
        self.norm = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)
        theirs = reference.state_dict()
        mine = {"words.weight": theirs["transformer.wte.weight"],
                "positions.weight": theirs["transformer.wpe.weight"],
                "norm.weight": theirs["transformer.ln_f.weight"],
                "norm.bias": theirs["transformer.ln_f.bias"]}
        parts = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_attn": "qkv", "attn.c_proj": "out",
                 "mlp.c_fc": "up", "mlp.c_proj": "down"}
        for i in range(c.n_layer):
            for theirs_name, my_name in parts.items():
                for leaf in ("weight", "bias"):
                    value = theirs[f"transformer.h.{i}.{theirs_name}.{leaf}"]
                    # a Conv1D keeps (in, out): a Linear wants (out, in)
                    mine[f"blocks.{i}.{my_name}.{leaf}"] = value.t() \
                        if leaf == "weight" and value.ndim == 2 else value
        self.load_state_dict(mine)

    def forward(self, input_ids: torch.Tensor, attention_mask: Any = None) -> torch.Tensor:
        length = input_ids.shape[1]
        x = self.words(input_ids) + self.positions(torch.arange(length))
        allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :].bool()
        blocked = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(x.dtype).min)
        for block in self.blocks:
            x = block(x, blocked)
        return self.norm(x) @ self.words.weight.t()


def build(reference: Any) -> FlatBlocksGPT2:
    model = reference if isinstance(reference, nn.Module) else reference.model
    return FlatBlocksGPT2(model).eval()
