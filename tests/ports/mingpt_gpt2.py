"""GPT-2 as minGPT's ``mingpt/model.py`` writes it, loaded as its ``from_pretrained`` does.

Imports nothing from introspect; written here in that repository's style by another hand
than ``nanogpt_gpt2.py``, not copied. What makes it minGPT:

- ``NewGELU`` written out with ``tanh`` (the approximation GPT-2 was trained with, HF's
  ``gelu_new``);
- ``CausalSelfAttention`` with a fused ``c_attn``, the attention written out
  (``q @ k.transpose(-2, -1)``, an explicit softmax) and the causal mask a ``tril``
  buffer named ``bias`` filled with ``-inf``;
- ``Block.mlp`` an ``nn.ModuleDict`` called through a lambda (``self.mlpf``), a closure over
  the dict;
- ``lm_head`` a weight of its own (not tied), copied from HF's;
- every HF ``Conv1D`` weight transposed on loading, every shape asserted.

minGPT takes no attention mask; ``forward`` here also takes ``attention_mask`` and fills
padded keys with ``finfo.min`` after the causal ``-inf``, so real tokens see what HF's see.

Faults (each in block ``layer``):

- ``gelu_erf``: ``NewGELU`` rewritten with ``erf``, the exact GELU GPT-2 does not use;
- ``kv_swapped``: the fused output split as query, value, key;
- ``causal_triu``: the mask buffer made with ``triu``, so each token sees itself and
  the ones after it;
- ``scale_by_embd``: scores divided by sqrt(n_embd) instead of sqrt(head size);
- ``mlp_residual_missing``: ``x = self.mlpf(...)`` where minGPT adds it to ``x``;
- ``ln_swapped``: ``ln_1`` and ``ln_2`` loaded from each other's HF weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("gelu_erf", "kv_swapped", "causal_triu", "scale_by_embd", "mlp_residual_missing",
          "ln_swapped")


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int  # longest sequence the position table holds
    n_layer: int
    n_head: int
    n_embd: int
    embd_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    attn_pdrop: float = 0.1


class NewGELU(nn.Module):
    """GELU as Google BERT and OpenAI GPT use it (the tanh approximation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class ErfGELU(nn.Module):
    """The exact GELU, written out the same way (what a port must not use for GPT-2)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


class CausalSelfAttention(nn.Module):
    """Multi-head masked self-attention with a projection at the end."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # key, query, value, fused
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        # the causal mask: 1 where a query may look at a key
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.split = ("q", "k", "v")
        self.scale_dim: int | None = None  # None: the head size

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.size()
        parts = dict(zip(self.split, self.c_attn(x).split(self.n_embd, dim=2), strict=True))
        q, k, v = parts["q"], parts["k"], parts["v"]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

        # (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.scale_dim or k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        if attention_mask is not None:  # padded keys, (B, 1, 1, T)
            padded = attention_mask[:, None, None, :] == 0
            att = att.masked_fill(padded, torch.finfo(att.dtype).min)
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # all heads side by side

        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    """A plain Transformer block."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.ModuleDict(dict(
            c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
            c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
            act=NewGELU(),
            dropout=nn.Dropout(config.resid_pdrop),
        ))
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))  # MLP forward
        self.mlp_residual = True

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attention_mask)
        y = self.mlpf(self.ln_2(x))
        return x + y if self.mlp_residual else y


class GPT(nn.Module):
    """GPT Language Model."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.block_size = config.block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.embd_pdrop),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t = input_ids.size()
        assert t <= self.block_size, f"cannot forward {t} tokens, block size is {self.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device).unsqueeze(0)  # (1, t)

        tok_emb = self.transformer.wte(input_ids)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (1, t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x, attention_mask)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # (b, t, vocab_size)


def from_pretrained(model_hf: nn.Module, fault: str | None = None, layer: int = 0) -> GPT:
    """minGPT's ``GPT.from_pretrained``, handed an HF ``GPT2LMHeadModel``."""
    if not hasattr(model_hf, "lm_head"):
        raise ValueError("minGPT's GPT ends in lm_head: give it an HF GPT2LMHeadModel, "
                         f"not a {type(model_hf).__name__}")
    c = model_hf.config
    assert (c.n_inner or 4 * c.n_embd) == 4 * c.n_embd and c.layer_norm_epsilon == 1e-5
    config = GPTConfig(vocab_size=c.vocab_size, block_size=c.n_positions, n_layer=c.n_layer,
                       n_head=c.n_head, n_embd=c.n_embd)
    model = GPT(config)
    sd = model.state_dict()
    sd_hf = {k: v for k, v in model_hf.state_dict().items()
             if not k.endswith((".attn.masked_bias", ".attn.bias"))}
    keys = [k for k in sd if not k.endswith(".attn.bias")]  # the mask is a buffer of ours
    assert len(keys) == len(sd_hf), f"{len(keys)} weights here, {len(sd_hf)} in HF's"
    # OpenAI's checkpoints use a "Conv1D" module: these are (in, out) there
    transposed = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                  "mlp.c_proj.weight")
    with torch.no_grad():
        for k in keys:
            source = k
            if fault == "ln_swapped" and k.startswith(f"transformer.h.{layer}.ln_"):
                source = k.replace(".ln_1.", ".ln_@.").replace(".ln_2.", ".ln_1.")
                source = source.replace(".ln_@.", ".ln_2.")
            w = sd_hf[source]
            if k.endswith(transposed):
                assert w.shape[::-1] == sd[k].shape, (k, tuple(w.shape))
                w = w.t()
            assert w.shape == sd[k].shape, (k, tuple(w.shape))
            sd[k].copy_(w)
    return model


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (an HF ``GPT2LMHeadModel``), with ``fault``
    in block ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    if not isinstance(reference, nn.Module):  # the CLI hands over its loaded reference
        reference = reference.model
    model = from_pretrained(reference, fault, layer)
    block = model.transformer.h[layer]
    if fault == "gelu_erf":
        block.mlp.act = ErfGELU()
    elif fault == "kv_swapped":
        block.attn.split = ("q", "v", "k")
    elif fault == "causal_triu":
        block.attn.bias.copy_(block.attn.bias[0, 0].t().clone()[None, None])
    elif fault == "scale_by_embd":
        block.attn.scale_dim = block.attn.n_embd
    elif fault == "mlp_residual_missing":
        block.mlp_residual = False
    return model.eval()
