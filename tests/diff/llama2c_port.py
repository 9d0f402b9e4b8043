"""A Llama in the style of llama2.c's ``model.py``, loaded the way its export script maps
HF weights. Written for the tests; imports only torch.

What makes it unlike HF's ``LlamaForCausalLM``:

- rotary embeddings on *interleaved* pairs (dims 2i and 2i+1 of each head rotate
  together, as in Meta's original code), where HF rotates dims i and i + hd/2; so the
  rows of ``wq`` and ``wk`` are permuted within each head on loading;
- heads kept as (B, S, nh, hd) through the rotary step, transposed only for attention;
- ``F.scaled_dot_product_attention(..., is_causal=True)`` and no padding mask (padded
  positions compute garbage; real tokens of a right-padded batch see only real tokens);
- RMSNorm written out, SwiGLU as ``w2(silu(w1(x)) * w3(x))``, names ``wq``, ``w1``, ...

``build(reference, fault=None, layer=0, attention="sdpa")`` returns the port in eval mode;
``attention="einsum"`` writes the attention out with einsum and keeps the context as
(B, S, nh, hd), never transposing the heads. ``FAULTS``:

- ``wk_unpermuted``: ``wk`` of layer ``layer`` loaded as HF stores it (no permutation):
  the interleaved rotary then pairs the wrong dimensions;
- ``wv_perturbed``: one value weight of layer ``layer`` off by 0.05;
- ``qk_swapped`` (``attention="einsum"`` only): the scores of layer ``layer`` computed as
  k·q, the transpose of q·k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("wk_unpermuted", "wv_perturbed", "qk_swapped")


def interleave_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's half-split rows of each head -> interleaved rows (llama2.c's export mapping).

    Within a head of ``hd`` rows, row ``p * hd/2 + i`` (half ``p``, index ``i``) moves to
    row ``2 * i + p``.
    """
    out_features, in_features = w.shape
    hd = out_features // heads
    return (w.reshape(heads, 2, hd // 2, in_features)  # (nh, half, hd/2, H)
            .transpose(1, 2)  # (nh, hd/2, half, H)
            .reshape(out_features, in_features))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def rotary_tables(head_dim: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's angles, (S, hd/2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(length).float(), freqs)  # (S, hd/2)
    return torch.cos(angles), torch.sin(angles)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` (B, S, nh, hd)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, S, nh, hd/2, 2)
    real, imag = pairs.unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, S, 1, hd/2)
    out = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return out.flatten(3).type_as(x)  # (B, S, nh, hd)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.qk_swapped = False
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, self.heads, self.head_dim)  # (B, S, nh, hd)
        k = self.wk(x).view(B, S, self.kv_heads, self.head_dim)  # (B, S, kv, hd)
        v = self.wv(x).view(B, S, self.kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeats = self.heads // self.kv_heads
        k = k.repeat_interleave(repeats, dim=2)  # (B, S, nh, hd)
        v = v.repeat_interleave(repeats, dim=2)
        if self.kind == "einsum":
            if self.qk_swapped:
                q, k = k, q
            scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
            causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            probs = scores.float().softmax(dim=-1).type_as(q)  # (B, nh, S, S)
            out = torch.einsum("bhqk,bkhd->bqhd", probs, v)  # (B, S, nh, hd)
            return self.wo(out.reshape(B, S, -1))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, nh, S, hd)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(B, S, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float,
                 kind: str) -> None:
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads, kind)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int,
                 hidden: int, eps: float, max_len: int, theta: float,
                 attention: str = "sdpa") -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads, kv_heads, hidden, eps, attention)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim, eps)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rotary_tables(dim // heads, max_len, theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        h = self.tok_embeddings(input_ids)  # (B, S, H)
        cos, sin = self.freqs_cos[:S], self.freqs_sin[:S]
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))  # (B, S, vocab)


def _theta(config: object) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def build(reference: nn.Module, fault: str | None = None, layer: int = 0,
          attention: str = "sdpa") -> Transformer:
    """The port holding ``reference``'s weights (an HF ``LlamaForCausalLM``)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    c = reference.config
    port = Transformer(c.vocab_size, c.hidden_size, c.num_hidden_layers,
                       c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
                       c.rms_norm_eps, c.max_position_embeddings, _theta(c), attention)
    hf = reference.state_dict()
    mapping = {"tok_embeddings.weight": "model.embed_tokens.weight",
               "norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    for i in range(c.num_hidden_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        for a, b in (("attention.wq", "self_attn.q_proj"), ("attention.wk", "self_attn.k_proj"),
                     ("attention.wv", "self_attn.v_proj"), ("attention.wo", "self_attn.o_proj"),
                     ("feed_forward.w1", "mlp.gate_proj"), ("feed_forward.w2", "mlp.down_proj"),
                     ("feed_forward.w3", "mlp.up_proj"), ("attention_norm", "input_layernorm"),
                     ("ffn_norm", "post_attention_layernorm")):
            mapping[f"{ours}{a}.weight"] = f"{theirs}{b}.weight"
    state = {}
    for key, source in mapping.items():
        w = hf[source].detach().clone()
        if key.endswith("attention.wq.weight"):
            w = interleave_rows(w, c.num_attention_heads)
        elif key.endswith("attention.wk.weight") and not (
                fault == "wk_unpermuted" and key.startswith(f"layers.{layer}.")):
            w = interleave_rows(w, c.num_key_value_heads)
        if fault == "wv_perturbed" and key == f"layers.{layer}.attention.wv.weight":
            w[0, 0] += 0.05
        state[key] = w
    expected = port.state_dict()
    for key, w in state.items():
        if expected[key].shape != w.shape:
            raise ValueError(f"{key}: shape {tuple(w.shape)}, expected "
                             f"{tuple(expected[key].shape)}")
    port.load_state_dict(state, strict=False)
    if fault == "qk_swapped":
        port.layers[layer].attention.qk_swapped = True
    return port.eval()
