"""A GPT-2 written by hand with a concatenated cache, ``(B, S, nh, hd)`` per layer (heads
after the sequence, unlike HF), for ``diff --generate`` tests. Imports torch only.

``bug`` injects one incremental-decoding bug (None: correct):

- ``update-twice``: the new keys and values appended twice
- ``not-updated``: the cache returned as it came (the new keys used, never kept)
- ``wrong-axis``: the new keys concatenated on the heads axis
- ``positions-off-by-one``: positions start at the cache's length + 1
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

Cache = list[tuple[torch.Tensor, torch.Tensor]]


class GPT2(nn.Module):
    def __init__(self, hf: nn.Module, bug: str | None = None) -> None:
        super().__init__()
        c = hf.config
        self.bug, self.heads, self.eps = bug, c.n_head, c.layer_norm_epsilon
        self.wte = nn.Parameter(hf.transformer.wte.weight.detach().clone())
        self.wpe = nn.Parameter(hf.transformer.wpe.weight.detach().clone())
        # every block's weights by name, Conv1D kept as (in, out): x @ W + b
        self.blocks = nn.ModuleList()
        for block in hf.transformer.h:
            weights = nn.ParameterDict({name.replace(".", "_"): nn.Parameter(t.detach().clone())
                                        for name, t in block.named_parameters()})
            self.blocks.append(weights)
        self.ln_f_weight = nn.Parameter(hf.transformer.ln_f.weight.detach().clone())
        self.ln_f_bias = nn.Parameter(hf.transformer.ln_f.bias.detach().clone())

    def attention(self, w: nn.ParameterDict, x: torch.Tensor,
                  past: tuple[torch.Tensor, torch.Tensor] | None,
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, C = x.shape
        hd = C // self.heads
        q, k, v = (x @ w["attn_c_attn_weight"] + w["attn_c_attn_bias"]).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, hd) for t in (q, k, v))  # (B, T, nh, hd)
        if past is None:
            keys, values = k, v
        elif self.bug == "wrong-axis":
            keys, values = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        else:
            keys, values = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
        present = (keys, values)
        if self.bug == "update-twice" and past is not None:
            present = (torch.cat([keys, k], dim=1), torch.cat([values, v], dim=1))
        if self.bug == "not-updated" and past is not None:
            present = past
        S = keys.shape[1]
        scores = torch.einsum("bthd,bshd->bhts", q, keys) / hd ** 0.5  # (B, nh, T, S)
        allowed = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        y = torch.einsum("bhts,bshd->bthd", probs, values).reshape(B, T, C)
        return y @ w["attn_c_proj_weight"] + w["attn_c_proj_bias"], present

    def forward(self, input_ids: torch.Tensor, past_key_values: Cache | None = None,
                use_cache: bool = True) -> tuple[torch.Tensor, Cache]:
        T = input_ids.shape[1]
        start = past_key_values[0][0].shape[1] if past_key_values else 0
        if self.bug == "positions-off-by-one" and past_key_values:
            start += 1
        x = self.wte[input_ids] + self.wpe[start:start + T]
        C = x.shape[-1]
        presents: Cache = []
        for i, w in enumerate(self.blocks):
            h = F.layer_norm(x, (C,), w["ln_1_weight"], w["ln_1_bias"], self.eps)
            attended, present = self.attention(w, h, past_key_values[i] if past_key_values
                                               else None)
            presents.append(present)
            x = x + attended
            h = F.layer_norm(x, (C,), w["ln_2_weight"], w["ln_2_bias"], self.eps)
            h = F.gelu(h @ w["mlp_c_fc_weight"] + w["mlp_c_fc_bias"], approximate="tanh")
            x = x + (h @ w["mlp_c_proj_weight"] + w["mlp_c_proj_bias"])
        x = F.layer_norm(x, (C,), self.ln_f_weight, self.ln_f_bias, self.eps)
        return x @ self.wte.t(), presents
