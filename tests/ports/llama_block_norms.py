"""Llama whose blocks own their Linears and compute their norms in plain code (imports only
torch).

Written the way a port built around fused or custom kernels reads: each block holds its
seven projections as ``nn.Linear`` submodules and its two RMSNorm gains as its own
Parameters, and normalizes between them with a function of its own, as a custom op or a
Triton kernel would be called. The rotary on half-split pairs from cos/sin tables computed
per call, grouped keys and values by ``repeat_interleave``, the attention by ``softmax``
of masked scores, SwiGLU.

Module evidence sees each block and its Linears, not the norms: a norm's fault is inside
the block, between its Linears.

The fault (in layer ``layer``): ``eps``, the post-attention RMSNorm with eps 1e-5 where the
config says 1e-6.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """The kernel a port would call: no module of its own."""
    return gain * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class Block(nn.Module):
    def __init__(self, config: Any, eps: float, post_eps: float) -> None:
        super().__init__()
        width, heads, groups = (config.hidden_size, config.num_attention_heads,
                                config.num_key_value_heads)
        self.heads, self.groups, self.head_dim = heads, groups, width // heads
        self.eps, self.post_eps = eps, post_eps
        self.q = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k = nn.Linear(width, groups * self.head_dim, bias=False)
        self.v = nn.Linear(width, groups * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, width, bias=False)
        self.gate = nn.Linear(width, config.intermediate_size, bias=False)
        self.up = nn.Linear(width, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, width, bias=False)
        self.attention_gain = nn.Parameter(torch.ones(width))
        self.mlp_gain = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        h = rms_norm(x, self.attention_gain, self.eps)
        q = self.q(h).view(B, S, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(B, S, self.groups, self.head_dim).transpose(1, 2)
        v = self.v(h).view(B, S, self.groups, self.head_dim).transpose(1, 2)
        q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
        k = k.repeat_interleave(self.heads // self.groups, dim=1)
        v = v.repeat_interleave(self.heads // self.groups, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, -1)
        x = x + self.o(context)
        h = rms_norm(x, self.mlp_gain, self.post_eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class BlockLlama(nn.Module):
    def __init__(self, reference: Any, fault: str = "", layer: int = 2) -> None:
        super().__init__()
        config = reference.config
        self.theta = float(config.rope_parameters["rope_theta"])
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(
            Block(config, self.eps, 1e-5 if fault == "eps" and i == layer else self.eps)
            for i in range(config.num_hidden_layers))
        self.final_gain = nn.Parameter(torch.ones(config.hidden_size))
        names = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v",
                 "self_attn.o_proj": "o", "mlp.gate_proj": "gate", "mlp.up_proj": "up",
                 "mlp.down_proj": "down", "input_layernorm": "attention_gain",
                 "post_attention_layernorm": "mlp_gain"}
        state = {"embed.weight": reference.embed_tokens.weight,
                 "final_gain": reference.norm.weight}
        for name, value in reference.state_dict().items():
            if name.startswith("layers."):
                _, number, rest = name.split(".", 2)
                part = rest.removesuffix(".weight")
                key = names[part] if "layernorm" in part else f"{names[part]}.weight"
                state[f"blocks.{number}.{key}"] = value
        self.load_state_dict({k: v.detach().clone() for k, v in state.items()})

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, S = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]
        positions = torch.arange(S, dtype=torch.float32)
        inverse = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(positions, inverse)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, allowed)
        return rms_norm(x, self.final_gain, self.eps)


def build(reference: Any, fault: str = "", layer: int = 2) -> BlockLlama:
    return BlockLlama(reference, fault, layer).eval()
