"""GPT-2 in the style of nanoGPT's ``model.py``, loaded from an HF ``GPT2LMHeadModel``.
Written for the tests; imports only torch.

HF's Conv1D flattens the rows to ``(B*S, F)`` before its ``addmm``; this port keeps
``(B, S, F)`` with ``nn.Linear`` (every Conv1D weight transposed on loading, as nanoGPT's
``from_pretrained`` does), and runs ``F.scaled_dot_product_attention(is_causal=True)``
with no padding mask: padded positions compute something else, real tokens of a
right-padded batch agree.

``build(reference, fault=None, layer=0)``; ``FAULTS``: ``fc_bias_off`` (the MLP's ``c_fc``
bias of block ``layer`` off by 0.05); two that change only the backward, in block
``layer``'s own forward: ``output_detached`` (its output returned detached) and
``output_hooked`` (a tensor hook on its output scaling the gradient by 1.05).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("fc_bias_off", "output_detached", "output_hooked")


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, eps: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = MLP(n_embd)
        self.fault = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out = x + self.mlp(self.ln_2(x))
        if self.fault == "output_detached":
            return out.detach()
        if self.fault == "output_hooked" and out.requires_grad:
            out.register_hook(lambda g: g * 1.05)
        return out


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 eps: float) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, eps) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device)  # (t,)
        x = self.wte(input_ids) + self.wpe(pos)  # (B, t, C)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, t, vocab)


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> GPT:
    """The port holding ``reference``'s weights (an HF ``GPT2LMHeadModel``)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    c = reference.config
    port = GPT(c.vocab_size, c.n_positions, c.n_layer, c.n_head, c.n_embd,
               c.layer_norm_epsilon)
    hf = {k.removeprefix("transformer."): v for k, v in reference.state_dict().items()}
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state = {}
    for key, target in port.state_dict().items():
        if key == "lm_head.weight":
            continue
        w = hf[key].detach().clone()
        if key.endswith(conv1d):
            w = w.t().contiguous()
        if fault == "fc_bias_off" and key == f"h.{layer}.mlp.c_fc.bias":
            w += 0.05
        if w.shape != target.shape:
            raise ValueError(f"{key}: shape {tuple(w.shape)}, expected {tuple(target.shape)}")
        state[key] = w
    port.load_state_dict(state, strict=False)
    if fault in ("output_detached", "output_hooked"):
        port.h[layer].fault = fault
    return port.eval()
