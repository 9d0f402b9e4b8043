"""A Llama written the way Meta's reference code is (imports only torch).

Rotary embeddings on interleaved pairs, through complex numbers (``freqs_cis``,
``torch.view_as_complex``), so the rows of each head of HF's ``q_proj`` and ``k_proj``
(half-split) are permuted back to interleaved pairs at load time; grouped keys and values
by ``repeat_interleave``; RMSNorm in float32, cast back; attention by hand with a causal
mask. It agrees with HF's ``LlamaModel`` within rounding, forward and backward: its q and
k hold HF's features in another order, found by the diff at run time (a feature order),
which the gradients' comparison must use too.

Faults (``build(reference, fault, layer)``): ``eps`` (layer ``layer``'s RMSNorm eps 1e-3)
and ``theta`` (its rotary base 500000 instead of the config's).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def freqs_cis(head_dim: int, length: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # (length, head_dim / 2)


def rotary(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * cis[None, :, None, :]).flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = rotary(self.wq(x).view(B, S, self.heads, self.head_dim), cis)
        k = rotary(self.wk(x).view(B, S, self.kv_heads, self.head_dim), cis)
        v = self.wv(x).view(B, S, self.kv_heads, self.head_dim)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim) + mask
        weights = F.softmax(scores.float(), dim=-1).type_as(q)
        return self.wo((weights @ v).transpose(1, 2).contiguous().view(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: Any, eps: float, theta: float) -> None:
        super().__init__()
        dim = config.hidden_size
        self.attention = Attention(dim, config.num_attention_heads,
                                   config.num_key_value_heads)
        self.feed_forward = FeedForward(dim, config.intermediate_size)
        self.attention_norm, self.ffn_norm = RMSNorm(dim, eps), RMSNorm(dim, eps)
        self.theta = theta

    def forward(self, x: torch.Tensor, cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


def _theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class Transformer(nn.Module):
    def __init__(self, config: Any, fault: str | None, layer: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            Block(config, 1e-3 if fault == "eps" and i == layer else config.rms_norm_eps,
                  500000.0 if fault == "theta" and i == layer else _theta(config))
            for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head_dim = config.hidden_size // config.num_attention_heads

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        B, S = input_ids.shape
        h = self.tok_embeddings(input_ids)
        mask = torch.full((S, S), float("-inf")).triu(1)[None, None]
        if attention_mask is not None:
            mask = mask.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        for block in self.layers:
            h = block(h, freqs_cis(self.head_dim, S, block.theta), mask)
        return {"last_hidden_state": self.norm(h)}


def _interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's rows of each head (first halves, then second halves) as interleaved pairs."""
    rows, columns = weight.shape
    return weight.view(heads, 2, rows // heads // 2, columns).transpose(1, 2) \
        .reshape(rows, columns)


def build(reference: Any, fault: str | None = None, layer: int = -1) -> Transformer:
    """``reference``: HF's ``LlamaModel``, or what ``--candidate`` hands a builder."""
    config = reference.config
    model = Transformer(config, fault, layer)
    hf = {k: v.detach().clone()
          for k, v in getattr(reference, "model", reference).state_dict().items()}
    state = {"tok_embeddings.weight": hf["embed_tokens.weight"],
             "norm.weight": hf["norm.weight"]}
    for i in range(config.num_hidden_layers):
        mine, theirs = f"layers.{i}.", f"layers.{i}."
        state[mine + "attention.wq.weight"] = _interleaved(
            hf[theirs + "self_attn.q_proj.weight"], config.num_attention_heads)
        state[mine + "attention.wk.weight"] = _interleaved(
            hf[theirs + "self_attn.k_proj.weight"], config.num_key_value_heads)
        state[mine + "attention.wv.weight"] = hf[theirs + "self_attn.v_proj.weight"]
        state[mine + "attention.wo.weight"] = hf[theirs + "self_attn.o_proj.weight"]
        for part, hf_part in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj")):
            state[mine + f"feed_forward.{part}.weight"] = hf[theirs + f"mlp.{hf_part}.weight"]
        state[mine + "attention_norm.weight"] = hf[theirs + "input_layernorm.weight"]
        state[mine + "ffn_norm.weight"] = hf[theirs + "post_attention_layernorm.weight"]
    model.load_state_dict(state)
    return model.eval()
