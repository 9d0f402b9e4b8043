"""GPT-2 as nanoGPT's ``model.py`` writes it, loaded from an HF GPT-2 the way its
``from_pretrained`` does.

Imports nothing from introspect; written here in that repository's style, not copied.
What makes it nanoGPT:

- ``GPT.transformer`` is an ``nn.ModuleDict`` of ``wte``, ``wpe``, ``drop``, ``h``, ``ln_f``;
  ``lm_head`` shares its weight with ``wte``;
- ``CausalSelfAttention`` has one fused ``c_attn`` (C -> 3C) cut with ``.split`` and runs
  ``F.scaled_dot_product_attention(is_causal=True)``;
- every Linear is ``nn.Linear``, so HF's ``Conv1D`` weights (stored (in, out)) are
  transposed on loading, the four names listed as nanoGPT lists them, every shape checked;
- a ``LayerNorm`` of its own that calls ``F.layer_norm`` with eps 1e-5 written in.

nanoGPT takes no attention mask (it trains on full blocks). Here ``forward`` also takes
``attention_mask``, as people add it to batch padded prompts: padded keys are masked with
``finfo.min`` next to the causal mask, so a padded row's real tokens see what HF's do.
``build_as_released`` gives the port that ignores the mask, as nanoGPT ships: with padding
on the right the causal mask alone keeps every real token from the pads, so the real
tokens still agree with HF's; only the padded positions (which HF leaves undefined) differ.

Faults (each in block ``layer``):

- ``gelu_erf``: ``nn.GELU()``, nanoGPT's own choice, where GPT-2 uses the tanh
  approximation (``gelu_new``);
- ``qk_swapped``: the fused projection's output split as key, query, value;
- ``no_causal_mask``: the padding mask only, so every token sees the ones after it;
- ``scale_1_over_d``: scores scaled by 1/hs instead of 1/sqrt(hs);
- ``c_proj_untransposed``: the square attention output projection loaded without the
  transpose (no shape check can see it);
- ``missing_residual``: the attention's output replaces the residual stream;
- ``position_offset``: positions counted from 1 (the fault is in the embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("gelu_erf", "qk_swapped", "no_causal_mask", "scale_1_over_d", "c_proj_untransposed",
          "missing_residual", "position_offset")


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence (learned positions)
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in the Linears and LayerNorms, as GPT-2 has them
    lm_head: bool = True  # False: return ln_f's output (a GPT2Model has no head)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nn.LayerNorm cannot leave it out)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None
        self.eps = 1e-5

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.order = "qkv"
        self.causal = True
        self.scale: float | None = None  # None: sdpa's own 1/sqrt(hs)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, embedding dim
        a, b, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k = (a, b) if self.order == "qkv" else (b, a)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if pad is None and self.causal:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True,
                                               scale=self.scale)
        else:
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device)
            if self.causal:
                allowed = allowed.tril()
            if pad is not None:
                allowed = allowed[None, None] & pad[:, None, None, :]  # (B, 1, T, T)
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=x.device)
            mask = mask.masked_fill(~allowed, torch.finfo(q.dtype).min)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                               scale=self.scale)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's gelu_new
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.residual = True

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        a = self.attn(self.ln_1(x), pad)
        x = x + a if self.residual else a
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.lm_head:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.first_position = 0
        self.padding_mask = True  # False: nanoGPT as released, the mask ignored

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t = input_ids.size()
        assert t <= self.config.block_size, f"sequence of {t} > block size {self.config.block_size}"
        pos = torch.arange(self.first_position, self.first_position + t, dtype=torch.long,
                           device=input_ids.device)  # (t,)
        tok_emb = self.transformer.wte(input_ids)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        pad = None if attention_mask is None or not self.padding_mask else attention_mask.bool()
        for block in self.transformer.h:
            x = block(x, pad)
        x = self.transformer.ln_f(x)
        if not self.config.lm_head:
            return x
        return self.lm_head(x)  # (b, t, vocab): every position, not only the last


def from_pretrained(model_hf: nn.Module, fault: str | None = None, layer: int = 0) -> GPT:
    """nanoGPT's ``GPT.from_pretrained``, given the HF model rather than its name."""
    c = model_hf.config
    head = hasattr(model_hf, "lm_head")
    config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer,
                       n_head=c.n_head, n_embd=c.n_embd, lm_head=head)
    assert (c.n_inner or 4 * c.n_embd) == 4 * c.n_embd, "nanoGPT's MLP is 4 x n_embd wide"
    model = GPT(config)
    sd = model.state_dict()
    sd_keys = [k for k in sd if not k.endswith(".attn.bias")]  # a buffer, not a weight
    sd_hf = model_hf.state_dict()
    prefix = "" if head else "transformer."  # a GPT2Model's keys lack it
    sd_keys_hf = [prefix + k for k in sd_hf
                  if not k.endswith((".attn.masked_bias", ".attn.bias"))]
    sd_hf = {prefix + k: w for k, w in sd_hf.items()}
    # HF's Conv1D keeps these (in, out); nanoGPT's nn.Linear wants (out, in)
    transposed = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                  "mlp.c_proj.weight"]
    assert len(sd_keys_hf) == len(sd_keys), f"mismatched keys: {len(sd_keys_hf)} != {len(sd_keys)}"
    with torch.no_grad():
        for k in sd_keys_hf:
            if any(k.endswith(w) for w in transposed):
                assert sd_hf[k].shape[::-1] == sd[k].shape, k
                keep = (fault == "c_proj_untransposed"
                        and k == f"transformer.h.{layer}.attn.c_proj.weight")
                sd[k].copy_(sd_hf[k] if keep else sd_hf[k].t())
            else:
                assert sd_hf[k].shape == sd[k].shape, k
                sd[k].copy_(sd_hf[k])
    return model


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (HF ``GPT2LMHeadModel`` or ``GPT2Model``),
    with ``fault`` in block ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    if not isinstance(reference, nn.Module):  # the CLI hands over its loaded reference
        reference = reference.model
    model = from_pretrained(reference, fault, layer)
    if reference.config.layer_norm_epsilon != 1e-5:
        for m in model.modules():
            if isinstance(m, LayerNorm):
                m.eps = reference.config.layer_norm_epsilon
    block = model.transformer.h[layer]
    if fault == "gelu_erf":
        block.mlp.gelu = nn.GELU()
    elif fault == "qk_swapped":
        block.attn.order = "kqv"
    elif fault == "no_causal_mask":
        block.attn.causal = False
    elif fault == "scale_1_over_d":
        block.attn.scale = 1.0 / (model.config.n_embd // model.config.n_head)
    elif fault == "missing_residual":
        block.residual = False
    elif fault == "position_offset":
        model.first_position = 1
    return model.eval()


def build_as_released(reference: nn.Module) -> nn.Module:
    """The correct port with the attention mask ignored, as nanoGPT's ``forward`` has it."""
    model = build(reference)
    model.padding_mask = False
    return model


__all__ = ["FAULTS", "GPT", "GPTConfig", "build", "build_as_released", "from_pretrained"]
