"""GPT-2 written with nn.Linear, as people port it from the paper and HF's weights.

Imports nothing from introspect. HF's GPT-2 keeps its projections in Conv1D modules whose
weights are stored (in, out); this port uses nn.Linear (out, in), so every weight is
transposed on loading. The causal mask is a hand-made ``tril``, the padding mask an
additive one, the attention an explicit softmax, the MLP's GELU the tanh approximation.

Faults (each in block ``layer``), the classic ones of a GPT-2 port:

- ``c_proj_untransposed``: the attention's output projection (square, H x H) loaded
  without the transpose, so no shape error says so;
- ``qk_swapped``: the fused projection's output split as key, query, value;
- ``gelu_erf``: the exact GELU where GPT-2 uses the tanh approximation;
- ``no_causal_mask``: only the padding mask, so every token sees the ones after it;
- ``unscaled``: attention scores not divided by sqrt(head size).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("c_proj_untransposed", "qk_swapped", "gelu_erf", "no_causal_mask", "unscaled")


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        self.heads = heads
        self.split_order = "qkv"
        self.gelu = "tanh"
        self.causal = True
        self.scaled = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        first, second, v = self.qkv(self.ln_1(x)).split(H, dim=-1)
        q, k = (first, second) if self.split_order == "qkv" else (second, first)
        q, k, v = (t.view(B, S, self.heads, H // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2)
        if self.scaled:
            scores = scores / math.sqrt(H // self.heads)
        scores = scores + (mask if self.causal else mask[:, :, -1:, :])  # last row: padding only
        context = scores.softmax(dim=-1) @ v
        x = x + self.out(context.transpose(1, 2).reshape(B, S, H))
        return x + self.down(F.gelu(self.up(self.ln_2(x)), approximate=self.gelu))


class GPT2(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.n_positions, config.n_embd)
        inner = config.n_inner or 4 * config.n_embd
        self.blocks = nn.ModuleList(
            Block(config.n_embd, config.n_head, inner, config.layer_norm_epsilon)
            for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        x = self.tokens(input_ids) + self.positions(torch.arange(S, device=input_ids.device))
        causal = torch.ones(S, S, dtype=torch.bool, device=input_ids.device).tril()
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed,
                                                                      torch.finfo(x.dtype).min)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (an HF GPT2Model), with ``fault`` in ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    port = GPT2(reference.config)
    state = reference.state_dict()
    with torch.no_grad():
        port.tokens.weight.copy_(state["wte.weight"])
        port.positions.weight.copy_(state["wpe.weight"])
        port.ln_f.weight.copy_(state["ln_f.weight"])
        port.ln_f.bias.copy_(state["ln_f.bias"])
        for i, block in enumerate(port.blocks):
            hf = f"h.{i}."
            for mine, theirs in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
                getattr(block, mine).weight.copy_(state[hf + theirs + ".weight"])
                getattr(block, mine).bias.copy_(state[hf + theirs + ".bias"])
            for mine, theirs in (("qkv", "attn.c_attn"), ("out", "attn.c_proj"),
                                 ("up", "mlp.c_fc"), ("down", "mlp.c_proj")):
                weight = state[hf + theirs + ".weight"]  # Conv1D: (in, out)
                untransposed = fault == "c_proj_untransposed" and i == layer and mine == "out"
                getattr(block, mine).weight.copy_(weight if untransposed else weight.T)
                getattr(block, mine).bias.copy_(state[hf + theirs + ".bias"])
            if i == layer and fault == "qk_swapped":
                block.split_order = "kqv"
            if i == layer and fault == "gelu_erf":
                block.gelu = "none"
            if i == layer and fault == "no_causal_mask":
                block.causal = False
            if i == layer and fault == "unscaled":
                block.scaled = False
    return port.eval()
