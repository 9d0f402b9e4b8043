"""A Llama written Meta-style (own names, own rotary table, own KV cache). Torch only.
(Written by a probe helper, probe round m.)

opts:
  rope: 'half' | 'half_swapped' | 'complex' | 'interleaved'
  cache: 'tuple' | 'prealloc' | 'tensor' | 'prerot'
  faults (any): theta_at=(layer, theta, where) ; eps_at=(layer, eps) ; perm_at=layer ;
    gelu_at=layer ; gqa_at=layer ; pos_off_by_one ; no_rot_offset ; prerot_wrong ;
    drop_first
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def table(theta, hd, positions):
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    return torch.outer(positions.float(), freqs)  # (T, hd/2)


def rope(x, angles, style):
    # x: (B, T, h, hd)
    if style == "half":
        emb = torch.cat([angles, angles], -1)[None, :, None, :]
        x1, x2 = x.chunk(2, -1)
        return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()
    if style == "half_swapped":  # halves stored swapped; rotate the other way round
        emb = torch.cat([angles, angles], -1)[None, :, None, :]
        x1, x2 = x.chunk(2, -1)
        return x * emb.cos() + torch.cat([x2, -x1], -1) * emb.sin()
    if style == "complex":
        cis = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * cis).flatten(3).type_as(x)
    if style == "interleaved":
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack([xe * cos - xo * sin, xe * sin + xo * cos], -1).flatten(3)
    raise ValueError(style)


def permute_hf_to(style, w, n, hd):
    """HF q/k weight (n*hd, dim) -> this port's layout."""
    if style in ("complex", "interleaved"):  # undo HF's conversion permute
        return w.view(n, 2, hd // 2, -1).transpose(1, 2).reshape(n * hd, -1)
    if style == "half_swapped":
        return w.view(n, 2, hd // 2, -1).flip(1).reshape(n * hd, -1)
    return w


class Attention(nn.Module):
    def __init__(self, a, i):
        super().__init__()
        self.a, self.i = a, i
        self.nh, self.nkv, self.hd = a["heads"], a["kv"], a["hd"]
        b = a["bias"]
        self.wq = nn.Linear(a["dim"], self.nh * self.hd, bias=b)
        self.wk = nn.Linear(a["dim"], self.nkv * self.hd, bias=b)
        self.wv = nn.Linear(a["dim"], self.nkv * self.hd, bias=b)
        self.wo = nn.Linear(self.nh * self.hd, a["dim"], bias=b)

    def forward(self, x, pos, cache, start):
        a, f = self.a, self.a["faults"]
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.nh, self.hd)
        k = self.wk(x).view(B, T, self.nkv, self.hd)
        v = self.wv(x).view(B, T, self.nkv, self.hd)
        theta_q = theta_k = a["theta"]
        if "theta_at" in f and f["theta_at"][0] == self.i:
            if f["theta_at"][2] in ("q", "both"):
                theta_q = f["theta_at"][1]
            if f["theta_at"][2] in ("k", "both"):
                theta_k = f["theta_at"][1]
        rpos = pos
        if f.get("no_rot_offset") or f.get("norot_at") == self.i:
            rpos = torch.arange(T)
        q = rope(q, table(theta_q, self.hd, rpos), a["rope"])
        kr = rope(k, table(theta_k, self.hd, rpos), a["rope"])
        keys, values = self.cached(k, kr, v, cache, start, pos)
        S = keys.shape[1]
        g = self.nh // self.nkv
        if f.get("gqa_at") == self.i or (f.get("gqa_cached_at") == self.i and start > 0):
            keys, values = keys.repeat(1, 1, g, 1), values.repeat(1, 1, g, 1)
        else:
            keys = keys[:, :, :, None].expand(B, S, self.nkv, g, self.hd).reshape(
                B, S, self.nh, self.hd)
            values = values[:, :, :, None].expand(B, S, self.nkv, g, self.hd).reshape(
                B, S, self.nh, self.hd)
        scores = torch.einsum("bthd,bshd->bhts", q, keys) / math.sqrt(self.hd)
        Sq = S
        mask = torch.ones(T, Sq, dtype=torch.bool).tril(Sq - T)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), values)
        return self.wo(out.reshape(B, T, -1))

    def cached(self, k, kr, v, cache, start, pos):
        a, f = self.a, self.a["faults"]
        kind = a["cache"]
        if cache is None:
            return kr, v
        if kind == "tuple":
            past = cache.layers[self.i]
            if past is not None:
                keys, values = torch.cat([past[0], kr], 1), torch.cat([past[1], v], 1)
            else:
                keys, values = kr, v
            if f.get("drop_first") and past is None:
                cache.layers[self.i] = (keys[:, 1:], values[:, 1:])
            elif f.get("prerot_wrong"):
                # stores the raw (pre-rotary) keys, then uses them as if rotated
                rawk = k if past is None else torch.cat([past[0], k], 1)
                cache.layers[self.i] = (rawk, values)
            else:
                cache.layers[self.i] = (keys, values)
            return keys, values
        if kind == "prealloc":
            kc, vc = cache.k[self.i], cache.v[self.i]
            kc[:, start:start + k.shape[1]] = kr
            vc[:, start:start + k.shape[1]] = v
            return kc[:, :start + k.shape[1]], vc[:, :start + k.shape[1]]
        if kind == "tensor":  # one tensor (L, 2, B, S, nkv, hd), grown by concatenation
            new = torch.stack([kr, v])[None]
            if self.i == 0:
                cache.pending = []
            cache.pending.append(new)
            if cache.t is None:
                return kr, v
            return (torch.cat([cache.t[self.i, 0], kr], 1), torch.cat([cache.t[self.i, 1], v], 1))
        if kind == "prerot":  # correct: cache raw keys, re-rotate all keys each step
            past = cache.layers[self.i]
            raw = k if past is None else torch.cat([past[0], k], 1)
            values = v if past is None else torch.cat([past[1], v], 1)
            cache.layers[self.i] = (raw, values)
            allpos = torch.arange(raw.shape[1])
            return rope(raw, table(a["theta"], self.hd, allpos), a["rope"]), values
        raise ValueError(kind)


class Cache:
    def __init__(self, a, B):
        self.layers = [None] * a["layers"]
        self.pos = 0
        self.t = None
        self.pending = []
        if a["cache"] == "prealloc":
            shape = (B, 64, a["kv"], a["hd"])
            self.k = [torch.zeros(shape) for _ in range(a["layers"])]
            self.v = [torch.zeros(shape) for _ in range(a["layers"])]


class Block(nn.Module):
    def __init__(self, a, i):
        super().__init__()
        eps = a["eps"]
        if a["faults"].get("eps_at", (None,))[0] == i:
            eps = a["faults"]["eps_at"][1]
        self.attention_norm = RMSNorm(a["dim"], eps)
        self.attention = Attention(a, i)
        self.ffn_norm = RMSNorm(a["dim"], a["eps"])
        self.w1 = nn.Linear(a["dim"], a["ffn"], bias=False)
        self.w3 = nn.Linear(a["dim"], a["ffn"], bias=False)
        self.w2 = nn.Linear(a["ffn"], a["dim"], bias=False)
        self.act = F.gelu if a["faults"].get("gelu_at") == i else F.silu

    def forward(self, x, pos, cache, start):
        h = x + self.attention(self.attention_norm(x), pos, cache, start)
        n = self.ffn_norm(h)
        return h + self.w2(self.act(self.w1(n)) * self.w3(n))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.tok_embeddings = nn.Embedding(a["vocab"], a["dim"])
        self.layers = nn.ModuleList(Block(a, i) for i in range(a["layers"]))
        self.norm = RMSNorm(a["dim"], a["eps"])
        self.output = nn.Linear(a["dim"], a["vocab"], bias=False)

    def forward(self, input_ids, past_key_values=None, use_cache=False):
        B, T = input_ids.shape
        cache = past_key_values
        if cache is None and use_cache:
            cache = Cache(self.a, B)
        start = cache.pos if cache is not None else 0
        p0 = start
        if self.a["faults"].get("pos_off_by_one") and start > 0:
            p0 = start - 1
        pos = torch.arange(p0, p0 + T)
        h = self.tok_embeddings(input_ids)
        for layer in self.layers:
            h = layer(h, pos, cache, start)
        if cache is not None:
            cache.pos += T
            if self.a["cache"] == "tensor":
                new = torch.cat(cache.pending, 0)
                cache.t = new if cache.t is None else torch.cat([cache.t, new], 3)
                cache.pending = []
        return self.output(self.norm(h)), cache


NAMES = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head",
         "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
         "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
         "w1": "mlp.gate_proj", "w3": "mlp.up_proj", "w2": "mlp.down_proj"}


def make(ref, rope="half", cache="tuple", **faults):
    hf = ref.model
    c = ref.config
    rp = getattr(c, "rope_parameters", None)
    theta = rp["rope_theta"] if rp else c.rope_theta
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    a = dict(vocab=c.vocab_size, dim=c.hidden_size, layers=c.num_hidden_layers,
             heads=c.num_attention_heads, kv=c.num_key_value_heads, hd=hd,
             ffn=c.intermediate_size, eps=c.rms_norm_eps, theta=theta,
             bias=bool(getattr(c, "attention_bias", False)), rope=rope, cache=cache,
             faults=faults)
    model = Transformer(a)
    sd = hf.state_dict()
    new = {}
    for name in model.state_dict():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            mod, leaf = rest.rsplit(".", 1)
            src = f"model.layers.{i}.{NAMES[mod]}.{leaf}"
            t = sd[src]
            if mod in ("attention.wq", "attention.wk"):
                n = a["heads"] if mod == "attention.wq" else a["kv"]
                style = rope
                if faults.get("perm_at") == int(i) and mod == "attention.wk":
                    style = "half"  # forgot to permute k in this layer
                t = permute_hf_to(style, t if leaf == "weight" else t[:, None], n, hd)
                if leaf == "bias":
                    t = t[:, 0]
            new[name] = t
        else:
            mod, leaf = name.rsplit(".", 1)
            new[name] = sd[f"{NAMES[mod]}.{leaf}"]
    model.load_state_dict(new)
    return model.eval()
