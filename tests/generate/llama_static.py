"""A Llama written by hand with a pre-allocated static cache, rotary and grouped-query
attention, for ``diff --generate`` tests. Imports torch only.

The cache is one ``StaticCache`` per sequence: per layer ``k_cache``/``v_cache`` of
``(B, max_len, nkv, hd)``, written in place at ``pos``, read up to ``pos + T``.
``bug`` injects one classic incremental-decoding bug (None: correct):

- ``positions-restart``: positions restart at 0 once the cache is used
- ``positions-off-by-one``: positions start at ``pos - 1`` once the cache is used
- ``rotary-key-offset``: keys rotated at the chunk's own positions (0..T-1), queries right
- ``not-updated``: the new keys and values are used but never written into the cache
- ``mask-as-prompt``: the causal mask aligned top-left: a length-1 query sees key 0 only
- ``gqa-tiled``: key/value heads tiled (0,1,0,1) on the cached path
- ``attend-unfilled``: a length-1 query attends the whole pre-allocated cache
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class StaticCache:
    def __init__(self, layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
        shape = (batch, max_len, kv_heads, head_dim)  # (B, max_len, nkv, hd)
        self.k_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
        self.pos = 0  # positions filled

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.k_cache, self.v_cache, strict=True))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: (B, T, heads, hd) rotated to ``positions`` (T,), rotate-half convention."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * emb.cos() + rotated * emb.sin()


class Attention(nn.Module):
    def __init__(self, config: dict, index: int, bug: str | None) -> None:
        super().__init__()
        self.index, self.bug = index, bug
        self.heads, self.kv_heads = config["heads"], config["kv_heads"]
        self.head_dim = config["dim"] // self.heads
        self.wq = nn.Linear(config["dim"], self.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config["dim"], self.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config["dim"], self.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.heads * self.head_dim, config["dim"], bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                cache: StaticCache) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.heads, self.head_dim)
        k = self.wk(x).view(B, T, self.kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.kv_heads, self.head_dim)
        q = rotate(q, positions, inv_freq)
        k_positions = torch.arange(T) if self.bug == "rotary-key-offset" else positions
        k = rotate(k, k_positions, inv_freq)
        start = cache.pos
        end = start + T
        if self.bug == "not-updated" and start > 0:
            keys = torch.cat([cache.k_cache[self.index][:, :start], k], dim=1)
            values = torch.cat([cache.v_cache[self.index][:, :start], v], dim=1)
        else:
            cache.k_cache[self.index][:, start:end] = k
            cache.v_cache[self.index][:, start:end] = v
            stop = cache.k_cache[self.index].shape[1] \
                if self.bug == "attend-unfilled" and T == 1 else end
            keys = cache.k_cache[self.index][:, :stop]  # (B, S, nkv, hd)
            values = cache.v_cache[self.index][:, :stop]
        S = keys.shape[1]
        groups = self.heads // self.kv_heads
        if self.bug == "gqa-tiled" and start > 0:
            keys, values = keys.repeat(1, 1, groups, 1), values.repeat(1, 1, groups, 1)
        else:
            keys = keys.repeat_interleave(groups, dim=2)  # (B, S, nh, hd)
            values = values.repeat_interleave(groups, dim=2)
        q, keys, values = (t.transpose(1, 2) for t in (q, keys, values))  # (B, nh, ., hd)
        scores = q @ keys.transpose(-1, -2) / self.head_dim ** 0.5  # (B, nh, T, S)
        rows = torch.arange(T)[:, None]
        cols = torch.arange(S)[None, :]
        if self.bug == "mask-as-prompt":
            allowed = cols <= rows
        elif self.bug == "attend-unfilled" and T == 1:
            allowed = torch.ones(T, S, dtype=torch.bool)
        else:
            allowed = cols <= rows + start
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = scores.softmax(dim=-1) @ values  # (B, nh, T, hd)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    def __init__(self, config: dict, index: int, bug: str | None) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config["dim"], config["eps"])
        self.attention = Attention(config, index, bug)
        self.ffn_norm = RMSNorm(config["dim"], config["eps"])
        self.w1 = nn.Linear(config["dim"], config["hidden"], bias=False)  # gate
        self.w3 = nn.Linear(config["dim"], config["hidden"], bias=False)  # up
        self.w2 = nn.Linear(config["hidden"], config["dim"], bias=False)  # down

    def forward(self, x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                cache: StaticCache) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), positions, inv_freq, cache)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, config: dict, bug: str | None = None) -> None:
        super().__init__()
        self.config, self.bug = config, bug
        self.tok_embeddings = nn.Embedding(config["vocab"], config["dim"])
        self.layers = nn.ModuleList(Block(config, i, bug) for i in range(config["layers"]))
        self.norm = RMSNorm(config["dim"], config["eps"])
        self.output = nn.Linear(config["dim"], config["vocab"], bias=False)
        head_dim = config["dim"] // config["heads"]
        inv_freq = 1.0 / (config["theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids: torch.Tensor, past_key_values: StaticCache | None = None,
                use_cache: bool = False) -> tuple[torch.Tensor, StaticCache]:
        B, T = input_ids.shape
        cache = past_key_values
        if cache is None:  # a new sequence
            c = self.config
            cache = StaticCache(c["layers"], B, c["max_len"], c["kv_heads"],
                                c["dim"] // c["heads"], self.output.weight.dtype)
        start = cache.pos
        if self.bug == "positions-restart" and start > 0:
            start = 0
        if self.bug == "positions-off-by-one" and start > 0:
            start -= 1
        positions = torch.arange(start, start + T)
        x = self.tok_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.inv_freq, cache)
        cache.pos += T
        return self.output(self.norm(x)), cache

    @classmethod
    def from_hf(cls, hf: nn.Module, bug: str | None = None, max_len: int = 32) -> Llama:
        c = hf.config
        config = {"vocab": c.vocab_size, "dim": c.hidden_size, "layers": c.num_hidden_layers,
                  "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
                  "hidden": c.intermediate_size, "eps": c.rms_norm_eps,
                  "theta": c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None)
                  else c.rope_theta, "max_len": max_len}
        model = cls(config, bug)
        names = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm",
                 "output": "lm_head", "attention_norm": "input_layernorm",
                 "ffn_norm": "post_attention_layernorm", "attention.wq": "self_attn.q_proj",
                 "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
                 "attention.wo": "self_attn.o_proj", "w1": "mlp.gate_proj",
                 "w3": "mlp.up_proj", "w2": "mlp.down_proj"}
        theirs = hf.state_dict()
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                parts = name.rsplit(".", 1)
                if name.startswith("layers."):
                    _, i, rest = name.split(".", 2)
                    module = rest.rsplit(".", 1)[0]
                    source = f"model.layers.{i}.{names[module]}.{parts[1]}"
                else:
                    source = f"{names[parts[0]]}.{parts[1]}"
                tensor.copy_(theirs[source])
        return model.eval()


def build(reference: object) -> Llama:
    """``--candidate tests/generate/llama_static.py:build``: the correct port."""
    return Llama.from_hf(getattr(reference, "model", reference))


def build_gqa_tiled(reference: object) -> Llama:
    """The port with key/value heads tiled on the cached path."""
    return Llama.from_hf(getattr(reference, "model", reference), "gqa-tiled")
