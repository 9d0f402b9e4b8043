"""A Llama whose ``rotate_half`` concatenates the halves the other way round.

Imports nothing from introspect; only torch. HF's ``rotate_half(x)`` is
``cat(-x2, x1)``; this port's is ``cat(x2, -x1)``, and so it holds the rows of each head of
``q_proj`` and ``k_proj`` with their halves swapped (rows hd/2..hd first). Its q and k are
HF's with the halves of each head swapped, and so are their rotated values; the dot
products of attention sum the same terms in another order: the port agrees with HF's
``LlamaModel`` within rounding, at every depth.

Structure alone pairs this port's ``q[..., :hd/2]`` with HF's ``q[..., :hd/2]``: the two
hold different halves. A diff must not count that guess as a failure.

Faults (``build(reference, fault, layer)``):

- ``rope_base``: layer ``layer``'s rotary tables at base 500000 instead of the config's;
- ``silu_tanh``: layer ``layer``'s MLP gate through ``tanh`` instead of ``silu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("rope_base", "silu_tanh")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The other way round from HF's: (x2, -x1)."""
    first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((second, -first), dim=-1)


def rope_tables(head_dim: int, seqlen: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(seqlen).float(), inv_freq)  # (S, hd/2)
    angles = torch.cat((angles, angles), dim=-1)  # (S, hd)
    return angles.cos(), angles.sin()


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, base: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, hidden, bias=False)
        self.base = base

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.heads, self.hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.k_proj(x).view(B, S, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv_heads, self.hd).transpose(1, 2)
        cos, sin = rope_tables(self.hd, S, self.base)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, S, hd)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, inner: int, eps: float,
                 base: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = SelfAttention(hidden, heads, kv_heads, base)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, inner)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                 inner: int, eps: float, base: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, inner, eps, base)
                                    for _ in range(layers))
        self.norm = RMSNorm(hidden, eps)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, S = input_ids.shape
        causal = torch.ones(S, S, dtype=torch.bool).tril()[None, None]  # (1, 1, S, S)
        if attention_mask is not None:
            causal = causal & attention_mask[:, None, None, :].bool()
        mask = torch.zeros(causal.shape).masked_fill(~causal, torch.finfo(torch.float32).min)
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, mask)
        return self.norm(h)


def swap_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The rows of each head with their two halves swapped: (hd/2..hd, 0..hd/2)."""
    rows, cols = w.shape
    per_head = w.view(heads, 2, rows // heads // 2, cols)
    return per_head.flip(1).reshape(rows, cols)


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding an HF ``LlamaModel``'s weights, ``fault`` in layer ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    config = reference.config
    rope = getattr(config, "rope_parameters", None) or {}
    base = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    model = Llama(config.vocab_size, config.hidden_size, config.num_hidden_layers, heads,
                  kv_heads, config.intermediate_size, config.rms_norm_eps, base)
    state = reference.state_dict()
    mine = model.state_dict()
    with torch.no_grad():
        for key, target in mine.items():
            w = state[key]
            if key.endswith("q_proj.weight"):
                w = swap_halves(w, heads)
            elif key.endswith("k_proj.weight"):
                w = swap_halves(w, kv_heads)
            assert w.shape == target.shape, (key, tuple(w.shape), tuple(target.shape))
            target.copy_(w)
    block = model.layers[layer]
    if fault == "rope_base":
        block.self_attn.base = 500000.0
    elif fault == "silu_tanh":
        block.mlp.act = torch.tanh
    return model.eval()
