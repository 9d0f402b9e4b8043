"""A GPT-2 written by hand, with its own key/value cache (nanoGPT style), to check with
``introspect diff --generate``.

One file, torch only: the model from its smallest part to the whole, a cache that is a
tuple of ``(keys, values)`` per layer, each ``(B, nh, T, hd)``, grown by concatenation.
``forward(input_ids, past_key_values=None, use_cache=False)`` returns
``(logits, cache)``: the protocol ``introspect diff --generate`` decodes by.

``positions_advance=False`` is the classic bug: positions that restart at 0 once a
cache is used (``torch.arange(T)`` where it should start at the cache's length).

    introspect diff --model gpt2 --head causal-lm --generate 8 \\
        --candidate examples/generation/gpt2_cached.py:build
    introspect diff --model gpt2 --head causal-lm --generate 8 \\
        --candidate examples/generation/gpt2_cached.py:build_positions_not_advanced
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Cache = tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer: (B, nh, T, hd) twice


@dataclass
class GPTConfig:
    block_size: int = 1024  # the longest sequence (learned positions)
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    eps: float = 1e-5  # LayerNorm epsilon
    positions_advance: bool = True  # False: the bug, positions restart at 0 with a cache


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v side by side
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, nh, past + T, hs)
            v = torch.cat([past[1], v], dim=2)
        S = k.shape[2]
        # query i sits at position S - T + i: it sees the keys up to there
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y), (k, v)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        attended, present = self.attn(self.ln_1(x), past)
        x = x + attended
        return x + self.mlp(self.ln_2(x)), present


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2's

    def forward(self, input_ids: torch.Tensor, past_key_values: Cache | None = None,
                use_cache: bool = False) -> tuple[torch.Tensor, Cache | None]:
        B, T = input_ids.shape
        start = past_key_values[0][0].shape[2] if past_key_values else 0
        if not self.config.positions_advance:
            start = 0  # the bug: the cache's length forgotten
        pos = torch.arange(start, start + T, dtype=torch.long)  # (T,)
        x = self.wte(input_ids) + self.wpe(pos)  # (B, T, C)
        presents = []
        for i, block in enumerate(self.h):
            x, present = block(x, past_key_values[i] if past_key_values else None)
            presents.append(present)
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return logits, tuple(presents) if use_cache else None

    @classmethod
    def from_hf(cls, hf: nn.Module, **options: bool) -> GPT:
        """Copy the weights of an HF ``GPT2LMHeadModel`` (its Conv1D weights transposed)."""
        c = hf.config
        config = GPTConfig(c.n_positions, c.vocab_size, c.n_layer, c.n_head, c.n_embd,
                           c.layer_norm_epsilon, **options)
        model = cls(config)
        theirs = hf.state_dict()
        transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                      "mlp.c_proj.weight")
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if name == "lm_head.weight":
                    continue  # tied to wte
                source = theirs[f"transformer.{name}"]
                if name.endswith(transposed):
                    source = source.t()
                if source.shape != tensor.shape:
                    raise ValueError(f"{name}: {tuple(source.shape)} != {tuple(tensor.shape)}")
                tensor.copy_(source)
        return model.eval()


def build(reference: object) -> GPT:
    """``--candidate examples/generation/gpt2_cached.py:build``: the correct port."""
    return GPT.from_hf(getattr(reference, "model", reference))


def build_positions_not_advanced(reference: object) -> GPT:
    """The same port with the bug: positions restart at 0 once the cache is used."""
    return GPT.from_hf(getattr(reference, "model", reference), positions_advance=False)


@torch.no_grad()
def generate(model: GPT, input_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy decoding with the cache: the prompt once, then one token at a time."""
    logits, cache = model(input_ids, use_cache=True)
    tokens = [logits[:, -1].argmax(-1)]
    for _ in range(steps - 1):
        logits, cache = model(tokens[-1][:, None], past_key_values=cache, use_cache=True)
        tokens.append(logits[:, -1].argmax(-1))
    return torch.stack(tokens, dim=1)


__all__ = ["GPT", "GPTConfig", "build", "build_positions_not_advanced", "generate"]
