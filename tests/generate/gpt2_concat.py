"""A GPT-2 written by hand with a concatenated cache, ``(B, S, nh, hd)`` per layer (heads
after the sequence, unlike HF), for ``diff --generate`` tests. Imports torch only.

``bug`` injects one incremental-decoding bug (None: correct):

- ``update-twice``: the new keys and values appended twice
- ``not-updated``: the cache returned as it came (the new keys used, never kept)
- ``wrong-axis``: the new keys concatenated on the heads axis
- ``positions-off-by-one``: positions start at the cache's length + 1

``static=True``: the cache one object holding each layer's keys and values in two lists
of tensors pre-allocated to 64 positions, filled in place (``StaticLists``), as static
caches are often written.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

Cache = list[tuple[torch.Tensor, torch.Tensor]]


class StaticLists:
    """Every layer's keys and values, ``(B, 64, nh, hd)``, and how many are filled."""

    def __init__(self, layers: int, batch: int, heads: int, width: int) -> None:
        self.k_cache = [torch.zeros(batch, 64, heads, width) for _ in range(layers)]
        self.v_cache = [torch.zeros(batch, 64, heads, width) for _ in range(layers)]
        self.length = 0

    def layer(self, i: int, start: int, k: torch.Tensor, v: torch.Tensor,
              ) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[1]
        self.k_cache[i][:, start:end] = k
        self.v_cache[i][:, start:end] = v
        return self.k_cache[i][:, :end], self.v_cache[i][:, :end]


class GPT2(nn.Module):
    def __init__(self, hf: nn.Module, bug: str | None = None, static: bool = False) -> None:
        super().__init__()
        c = hf.config
        self.bug, self.heads, self.eps, self.static = bug, c.n_head, c.layer_norm_epsilon, static
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
                use_cache: bool = True) -> tuple[torch.Tensor, Cache | StaticLists]:
        if self.static:
            return self._static(input_ids, past_key_values)
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

    def _static(self, input_ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, StaticLists]:
        B, T = input_ids.shape
        C = self.wte.shape[1]
        hd = C // self.heads
        if cache is None:
            cache = StaticLists(len(self.blocks), B, self.heads, hd)
        start = cache.length
        x = self.wte[input_ids] + self.wpe[start:start + T]
        for i, w in enumerate(self.blocks):
            h = F.layer_norm(x, (C,), w["ln_1_weight"], w["ln_1_bias"], self.eps)
            q, k, v = (h @ w["attn_c_attn_weight"] + w["attn_c_attn_bias"]).split(C, dim=-1)
            q, k, v = (t.view(B, T, self.heads, hd) for t in (q, k, v))
            keys, values = cache.layer(i, start, k, v)
            S = keys.shape[1]
            scores = torch.einsum("bthd,bshd->bhts", q, keys) / hd ** 0.5
            allowed = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
            probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            y = torch.einsum("bhts,bshd->bthd", probs, values).reshape(B, T, C)
            x = x + (y @ w["attn_c_proj_weight"] + w["attn_c_proj_bias"])
            h = F.layer_norm(x, (C,), w["ln_2_weight"], w["ln_2_bias"], self.eps)
            h = F.gelu(h @ w["mlp_c_fc_weight"] + w["mlp_c_fc_bias"], approximate="tanh")
            x = x + (h @ w["mlp_c_proj_weight"] + w["mlp_c_proj_bias"])
        cache.length = start + T
        x = F.layer_norm(x, (C,), self.ln_f_weight, self.ln_f_bias, self.eps)
        return x @ self.wte.t(), cache
