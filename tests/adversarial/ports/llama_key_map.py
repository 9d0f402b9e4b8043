"""A Llama decoder written from its paper's equations, loaded from HF's state dict through a
key map, as a port's loader does: its blocks are ``blocks.N`` with ``attn.{wq,wk,wv,wo}``,
``ffn.{w1,w2,w3}``, ``attn_norm``, ``ffn_norm`` (Meta's names), and the rotary embedding
is taken on interleaved-free halves from a precomputed table.

``load(reference, slips)``: ``slips`` maps a (block, weight) of this port to the HF layer
its values are read from, where a slip in the key map reads another layer's (an
off-by-one). ``correct`` has none; the others each have one, named after it."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x.float() * scale).to(x.dtype)


def rope_table(head_dim, length, base):
    inverse = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    angles = torch.outer(torch.arange(length).float(), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def keep_rope_table(model, config):
    """``model.cos`` and ``model.sin``: the rotary table for every position."""
    head_dim = config.hidden_size // config.num_attention_heads
    cos, sin = rope_table(head_dim, config.max_position_embeddings,
                          getattr(config, "rope_theta", None)
                          or config.rope_parameters["rope_theta"])
    model.register_buffer("cos", cos, persistent=False)
    model.register_buffer("sin", sin, persistent=False)


def rotate(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, width, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.wq = nn.Linear(width, width, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        width = config.hidden_size
        self.attn_norm = RMSNorm(width, config.rms_norm_eps)
        self.attn = Attention(width, config.num_attention_heads, config.num_key_value_heads)
        self.ffn_norm = RMSNorm(width, config.rms_norm_eps)
        self.ffn = FeedForward(width, config.intermediate_size)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        keep_rope_table(self, config)

    def forward(self, input_ids, attention_mask=None):
        t = input_ids.shape[1]
        x = self.tok_embeddings(input_ids)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return {"last_hidden_state": self.norm(x)}


# this port's weight -> HF's, inside one block
KEYS = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
        "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
        "ffn.w1": "mlp.gate_proj", "ffn.w2": "mlp.down_proj", "ffn.w3": "mlp.up_proj",
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def load(reference, slips=None):
    slips = slips or {}
    state = reference.state_dict()
    model = Llama(reference.config)
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(state["embed_tokens.weight"])
        model.norm.weight.copy_(state["norm.weight"])
        for i, block in enumerate(model.blocks):
            for mine, theirs in KEYS.items():
                source = slips.get((i, mine), i)
                block.get_submodule(mine).weight.copy_(
                    state[f"layers.{source}.{theirs}.weight"])
    return model.eval()


def correct(reference):
    return load(reference)


def wo_from_block_before(reference):
    return load(reference, {(2, "attn.wo"): 1})


def attn_norm_from_block_before(reference):
    return load(reference, {(3, "attn_norm"): 2})


def ffn_norm_from_block_before(reference):
    return load(reference, {(1, "ffn_norm"): 0})


def block_copied_from_block_before(reference):
    return load(reference, {(3, key): 2 for key in KEYS})


def mlp_swapped_between_blocks(reference):
    """Blocks 1 and 2 trade their feed-forwards (two keys of the loader crossed)."""
    return load(reference, {**{(1, key): 2 for key in ("ffn.w1", "ffn.w2", "ffn.w3")},
                            **{(2, key): 1 for key in ("ffn.w1", "ffn.w2", "ffn.w3")}})


def wo_swapped_between_blocks(reference):
    return load(reference, {(1, "attn.wo"): 2, (2, "attn.wo"): 1})
