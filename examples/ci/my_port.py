"""A BERT encoder ported by hand, as it might live in your own repository.

It is written from the paper, in plain PyTorch, with its own names (``tok``, ``blocks``,
``ffn_in``), and knows nothing of introspect or transformers. ``build`` is what
``introspect diff --candidate my_port.py:build`` calls: it receives the loaded reference
(``.model``, ``.config``, ``.folder``, ``.tokenizer``) and returns the port holding the
reference's weights, loaded through an explicit key mapping.

Run:  introspect diff --model bert-tiny --candidate examples/ci/my_port.py:build
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


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
        x = self.tok(input_ids) + self.seg(token_type_ids)  # (B, S, H)
        return self.norm(x + self.pos(positions))


class Block(nn.Module):
    """One encoder layer: self-attention and a feed-forward network, each add & norm."""

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.act = nn.GELU()  # the exact (erf) GELU, as BERT
        self.ffn_out = nn.Linear(ffn, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        return x.view(B, S, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, S, hd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           scale=1 / math.sqrt(self.head_dim))  # (B, nh, S, hd)
        y = y.transpose(1, 2).reshape(B, S, H)  # (B, S, H)
        x = self.norm1(x + self.proj(y))
        return self.norm2(x + self.ffn_out(self.act(self.ffn_in(x))))


class MyBert(nn.Module):
    def __init__(self, vocab: int, positions: int, segments: int, hidden: int, layers: int,
                 heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.embed = Embeddings(vocab, positions, segments, hidden, eps)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, eps) for _ in range(layers))
        self.pool = nn.Linear(hidden, hidden)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S): True where a token is
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            x = block(x, mask)
        pooled = torch.tanh(self.pool(x[:, 0]))  # the [CLS] token
        return {"last_hidden_state": x, "pooler_output": pooled}


def hf_key(key: str) -> str:
    """This port's parameter name -> HF BertModel's (the whole mapping, spelled out)."""
    fixed = {"embed.tok": "embeddings.word_embeddings",
             "embed.pos": "embeddings.position_embeddings",
             "embed.seg": "embeddings.token_type_embeddings",
             "embed.norm": "embeddings.LayerNorm", "pool": "pooler.dense"}
    in_block = {"q": "attention.self.query", "k": "attention.self.key",
                "v": "attention.self.value", "proj": "attention.output.dense",
                "norm1": "attention.output.LayerNorm", "ffn_in": "intermediate.dense",
                "ffn_out": "output.dense", "norm2": "output.LayerNorm"}
    module, _, leaf = key.rpartition(".")
    if module in fixed:
        return f"{fixed[module]}.{leaf}"
    _, index, part = module.split(".")  # blocks.3.ffn_in
    return f"encoder.layer.{index}.{in_block[part]}.{leaf}"


def build(reference: Any) -> MyBert:
    """The port with the reference's weights (``introspect diff --candidate``'s contract)."""
    if type(reference.model).__name__ != "BertModel":
        raise ValueError("this port is a bare encoder; diff it with --head base")
    c = reference.config
    model = MyBert(c.vocab_size, c.max_position_embeddings, c.type_vocab_size, c.hidden_size,
                   c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
                   c.layer_norm_eps)
    weights = reference.model.state_dict()
    model.load_state_dict({key: weights[hf_key(key)] for key in model.state_dict()})
    return model.eval()
