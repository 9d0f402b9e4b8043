"""A Llama written from scratch, that borrows the reference's weights instead of copying them.

A 7B Llama's bfloat16 weights take 13.5 GB: a 24 GiB machine cannot hold them twice, so
the port's ``build`` takes the reference's tensors as its own. ``load_state_dict(...,
assign=True)`` makes each of the port's parameters the reference's tensor itself (the
memory-mapped checkpoint the reference reads), where a plain ``load_state_dict`` would copy
every value into memory the port allocated. The port is built on the meta device first,
so its own random weights are never allocated either.

Names are Meta's (``tok_embeddings``, ``attention.wq``, ``feed_forward.w1``), not HF's;
``HF_TO_PORT`` maps them. This file imports nothing from introspect::

    introspect diff --model path/to/llama --head causal-lm \\
        --candidate examples/large/llama_port.py:build --text "..."
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaArgs:
    dim: int = 4096  # hidden size
    n_layers: int = 32
    n_heads: int = 32  # query heads
    n_kv_heads: int = 32  # key/value heads (grouped-query attention when fewer)
    hidden_dim: int = 11008  # feed-forward inner size
    vocab_size: int = 32000
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # the norm in float32, as Meta's and HF's code do
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the halves of each head: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(repeat, dim=1)  # (B, nh, T, hd)
        v = v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(args.dim, args.hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def rotary_tables(self, T: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim = self.args.dim // self.args.n_heads
        inv_freq = 1.0 / (self.args.rope_theta
                          ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        angles = torch.outer(torch.arange(T).float(), inv_freq)  # (T, hd/2)
        angles = torch.cat((angles, angles), dim=-1)  # (T, hd)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T = input_ids.shape
        x = self.tok_embeddings(input_ids)  # (B, T, dim)
        cos, sin = self.rotary_tables(T, x.dtype)
        mask = torch.ones(T, T, dtype=torch.bool).tril()  # causal
        if attention_mask is not None:  # and no attention to padding keys
            mask = mask & attention_mask.bool()[:, None, None, :]  # (B, 1, T, T)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.output(self.norm(x))  # (B, T, vocab)


def hf_to_port(name: str) -> str:
    """An HF LlamaForCausalLM weight name -> this port's."""
    for hf, port in HF_TO_PORT:
        name = name.replace(hf, port)
    return name


HF_TO_PORT = [
    ("model.embed_tokens.", "tok_embeddings."), ("model.norm.", "norm."),
    ("model.layers.", "layers."), ("lm_head.", "output."),
    ("self_attn.q_proj", "attention.wq"), ("self_attn.k_proj", "attention.wk"),
    ("self_attn.v_proj", "attention.wv"), ("self_attn.o_proj", "attention.wo"),
    ("mlp.gate_proj", "feed_forward.w1"), ("mlp.up_proj", "feed_forward.w3"),
    ("mlp.down_proj", "feed_forward.w2"), ("input_layernorm", "attention_norm"),
    ("post_attention_layernorm", "ffn_norm"),
]


def build(reference) -> Llama:
    """The port, holding the reference's own tensors (no copy: see the module's docstring)."""
    c = reference.config
    args = LlamaArgs(dim=c.hidden_size, n_layers=c.num_hidden_layers,
                     n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads,
                     hidden_dim=c.intermediate_size, vocab_size=c.vocab_size,
                     norm_eps=c.rms_norm_eps,
                     rope_theta=getattr(c, "rope_theta", None)
                     or c.rope_parameters.get("rope_theta", 10000.0))
    with torch.device("meta"):  # shapes only: the port's own weights are never allocated
        model = Llama(args)
    state = {hf_to_port(name): tensor for name, tensor in reference.model.state_dict().items()
             if "rotary_emb" not in name}
    model.load_state_dict(state, assign=True)  # the reference's tensors, not copies of them
    return model.eval()
