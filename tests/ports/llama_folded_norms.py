"""A Llama whose RMSNorm gains are folded into the Linears that read them (imports only
torch).

Quantization and rotation tools (SmoothQuant, QuaRot) rewrite a Llama this way: each
decoder layer's two RMSNorms lose their gains, and ``q``/``k``/``v`` (``gate``/``up``) take
``W * gain`` instead, so the layer computes the same values with weightless norms. Those
Linears hold none of HF's weights as they are; ``o`` and ``down`` do. Written as one
module per layer with the attention inline: rotary by ``rotate_half``, grouped keys and
values by ``expand``, ``F.scaled_dot_product_attention`` with a causal mask and the
padding's, as a boolean mask.

``build(reference, fault, layer)``: ``fault`` ``"gelu"`` takes a tanh GELU instead of
SiLU in layer ``layer``'s MLP; ``"eps"`` its norms' eps 1e-2; ``"detach"`` cuts the
gradient through its gate (the forward is exact, the backward is not).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class FoldedLayer(nn.Module):
    def __init__(self, config: Any, eps: float, act: str) -> None:
        super().__init__()
        width = config.hidden_size
        self.heads, self.groups = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = width // self.heads
        self.eps, self.act = eps, act
        self.q = nn.Linear(width, self.heads * self.head_dim, bias=False)
        self.k = nn.Linear(width, self.groups * self.head_dim, bias=False)
        self.v = nn.Linear(width, self.groups * self.head_dim, bias=False)
        self.o = nn.Linear(self.heads * self.head_dim, width, bias=False)
        self.gate = nn.Linear(width, config.intermediate_size, bias=False)
        self.up = nn.Linear(width, config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        n = _normalized(x, self.eps)

        def heads(t: torch.Tensor, count: int) -> torch.Tensor:
            return t.view(batch, length, count, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(n), self.heads), heads(self.k(n), self.groups), \
            heads(self.v(n), self.groups)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        share = self.heads // self.groups
        k = k[:, :, None].expand(-1, -1, share, -1, -1).reshape(batch, self.heads, length, -1)
        v = v[:, :, None].expand(-1, -1, share, -1, -1).reshape(batch, self.heads, length, -1)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        x = x + self.o(mixed.transpose(1, 2).reshape(batch, length, -1))
        n = _normalized(x, self.eps)
        gate = self.gate(n)
        gate = F.gelu(gate, approximate="tanh") if self.act == "gelu" else F.silu(gate)
        if self.act == "detach":
            gate = gate.detach()
        return x + self.down(gate * self.up(n))


class FoldedLlama(nn.Module):
    def __init__(self, config: Any, fault: str | None, layer: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(
            FoldedLayer(config, 1e-2 if fault == "eps" and i == layer else config.rms_norm_eps,
                        fault if fault in ("gelu", "detach") and i == layer else "silu")
            for i in range(config.num_hidden_layers))
        self.final_gain = nn.Parameter(torch.ones(config.hidden_size))
        self.eps = config.rms_norm_eps
        rope = getattr(config, "rope_parameters", None) or {}
        self.base = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.head_dim = config.hidden_size // config.num_attention_heads

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        length = input_ids.shape[1]
        inverse = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.arange(length).float()[:, None] * inverse[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, None, :]
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, cos, sin, allowed)
        return {"last_hidden_state": _normalized(x, self.eps) * self.final_gain}


def build(reference: Any, fault: str | None = None, layer: int = -1) -> FoldedLlama:
    """``reference``: HF's ``LlamaModel``, or what ``--candidate`` hands a builder."""
    config = reference.config
    model = FoldedLlama(config, fault, layer)
    hf = {k: v.detach().clone()
          for k, v in getattr(reference, "model", reference).state_dict().items()}
    state = {"embed.weight": hf["embed_tokens.weight"], "final_gain": hf["norm.weight"]}
    for i in range(config.num_hidden_layers):
        at = f"layers.{i}."
        first = hf[at + "input_layernorm.weight"]
        second = hf[at + "post_attention_layernorm.weight"]
        for mine, theirs, gain in (
                ("q", "self_attn.q_proj", first), ("k", "self_attn.k_proj", first),
                ("v", "self_attn.v_proj", first), ("o", "self_attn.o_proj", None),
                ("gate", "mlp.gate_proj", second), ("up", "mlp.up_proj", second),
                ("down", "mlp.down_proj", None)):
            weight = hf[at + theirs + ".weight"]
            state[f"blocks.{i}.{mine}.weight"] = weight * gain[None, :] if gain is not None \
                else weight
    model.load_state_dict(state)
    return model.eval()
