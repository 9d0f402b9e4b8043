"""A BERT port in the style of nanoGPT / GPT-2: fused QKV, einsum attention, Conv1D weights.

Written for the tests on purpose, independently of ``introspect`` (it imports only torch).
What makes it unlike HF's BERT:

- one fused ``c_attn`` projection (H -> 3H) cut into q, k, v with ``.split``;
- GPT-2's ``Conv1D``: weights stored transposed, shape (in, out), applied as ``x @ W + b``;
- attention written out with ``torch.einsum`` and a pre-computed additive mask;
- the position lookup shaped (S, H), broadcast over the batch;
- a dict output ``{"hidden": ..., "pooled": ...}``.

Weights come from an HF ``BertModel`` (or ``BertFor*``) through an explicit key mapping
(q, k, v concatenated; every Linear transposed), with every shape checked.
``build(reference, fault=None, layer=0)`` returns the port in eval mode with one fault of
``FAULTS`` injected into encoder layer ``layer`` (or the embeddings / pooler).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = (
    "qk_swapped", "kv_swapped", "position_offset", "token_type_ignored", "token_type_twice",
    "mask_missing", "mask_on_query_axis", "mask_fill", "softmax_wrong_dim", "scale_1_over_d",
    "missing_residual", "pre_ln", "ln_unbiased_var", "ln_eps", "gelu_tanh", "pooler_no_tanh",
    "pooler_mean", "layers_out_of_order", "dropout_active", "weight_transposed",
    "weight_unloaded", "weight_from_other_layer",
)


@dataclass
class GPTConfig:
    vocab_size: int
    n_embd: int  # hidden size
    n_layer: int
    n_head: int
    n_inner: int  # MLP width
    block_size: int  # longest sequence (learned positions)
    n_segment: int  # token types
    ln_eps: float


class Conv1D(nn.Module):
    """GPT-2's linear layer: ``weight`` is stored (in, out), so y = x @ weight + bias."""

    def __init__(self, nx: int, nf: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm; ``unbiased`` reproduces a classic bug (torch.var's default)."""

    def __init__(self, ndim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim))
        self.eps = eps
        self.unbiased = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unbiased:
            mu = x.mean(-1, keepdim=True)
            var = torch.var(x, dim=-1, keepdim=True)
            return (x - mu) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class NewGELU(nn.Module):
    """The tanh approximation of GELU, as in GPT-2 (BERT uses the exact erf form)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):  # the name stays from nanoGPT; nothing here is causal
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd)
        self.c_proj = Conv1D(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(0.1)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.scale = 1.0 / math.sqrt(config.n_embd // config.n_head)
        self.softmax_dim = -1
        self.force_dropout = False

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.scale  # (B, nh, T, T)
        if mask is not None:
            att = att + mask
        att = F.softmax(att, dim=self.softmax_dim)
        if self.force_dropout:
            att = F.dropout(att, 0.1, training=True)
        else:
            att = self.attn_dropout(att)
        y = torch.einsum("bhqk,bhkd->bhqd", att, v)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all heads side by side
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.n_embd, config.n_inner)
        self.gelu: nn.Module = nn.GELU()
        self.c_proj = Conv1D(config.n_inner, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.ln_1 = LayerNorm(config.n_embd, config.ln_eps)
        self.mlp = MLP(config)
        self.ln_2 = LayerNorm(config.n_embd, config.ln_eps)
        self.pre_ln = False  # GPT-2 is pre-LN; BERT is post-LN
        self.residual = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x), mask)
            return x + self.mlp(self.ln_2(x))
        a = self.attn(x, mask)
        x = self.ln_1(x + a if self.residual else a)
        return self.ln_2(x + self.mlp(x))


class BertGPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            wtt=nn.Embedding(config.n_segment, config.n_embd),
            ln_e=LayerNorm(config.n_embd, config.ln_eps),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
        ))
        self.pooler = Conv1D(config.n_embd, config.n_embd)
        self.pos_shift = 0
        self.segment_uses = 1
        self.mask_mode = "key"  # "key", "query" or "none"
        self.mask_value = torch.finfo(torch.float32).min
        self.pool_mode = "cls_tanh"  # "cls_tanh", "cls" or "mean_tanh"

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        b, t = input_ids.size()
        pos = torch.arange(self.pos_shift, t + self.pos_shift, dtype=torch.long,
                           device=input_ids.device)  # (t,)
        x = self.transformer.wte(input_ids)  # (b, t, n_embd)
        for _ in range(self.segment_uses):
            x = x + self.transformer.wtt(token_type_ids)
        x = x + self.transformer.wpe(pos)  # (t, n_embd), broadcast over the batch
        x = self.transformer.ln_e(x)

        mask = None
        if self.mask_mode != "none":
            blocked = 1.0 - attention_mask.to(x.dtype)  # (b, t): 1 where padded
            blocked = blocked[:, None, :, None] if self.mask_mode == "query" \
                else blocked[:, None, None, :]
            mask = blocked * self.mask_value  # additive, computed once for every block
        for block in self.transformer.h:
            x = block(x, mask)

        if self.pool_mode == "mean_tanh":
            pooled = torch.tanh(self.pooler(x.mean(dim=1)))
        elif self.pool_mode == "cls":
            pooled = self.pooler(x[:, 0, :])
        else:
            pooled = torch.tanh(self.pooler(x[:, 0, :]))
        return {"hidden": x, "pooled": pooled}


def _mapping(n_layer: int) -> dict[str, tuple[str, ...]]:
    """Port parameter -> the HF parameters it is made of (several: concatenated)."""
    m: dict[str, tuple[str, ...]] = {
        "transformer.wte.weight": ("embeddings.word_embeddings.weight",),
        "transformer.wpe.weight": ("embeddings.position_embeddings.weight",),
        "transformer.wtt.weight": ("embeddings.token_type_embeddings.weight",),
        "transformer.ln_e.weight": ("embeddings.LayerNorm.weight",),
        "transformer.ln_e.bias": ("embeddings.LayerNorm.bias",),
        "pooler.weight": ("pooler.dense.weight",),
        "pooler.bias": ("pooler.dense.bias",),
    }
    for i in range(n_layer):
        h, L = f"transformer.h.{i}.", f"encoder.layer.{i}."
        for p in ("weight", "bias"):
            m[h + "attn.c_attn." + p] = tuple(f"{L}attention.self.{n}.{p}"
                                              for n in ("query", "key", "value"))
            m[h + "attn.c_proj." + p] = (f"{L}attention.output.dense.{p}",)
            m[h + "ln_1." + p] = (f"{L}attention.output.LayerNorm.{p}",)
            m[h + "mlp.c_fc." + p] = (f"{L}intermediate.dense.{p}",)
            m[h + "mlp.c_proj." + p] = (f"{L}output.dense.{p}",)
            m[h + "ln_2." + p] = (f"{L}output.LayerNorm.{p}",)
    return m


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> BertGPT:
    """The port holding ``reference``'s weights, with ``fault`` injected (None: correct)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    bert = getattr(reference, "bert", reference)
    hf = bert.config
    config = GPTConfig(hf.vocab_size, hf.hidden_size, hf.num_hidden_layers,
                       hf.num_attention_heads, hf.intermediate_size,
                       hf.max_position_embeddings, hf.type_vocab_size, hf.layer_norm_eps)
    torch.manual_seed(0)  # parameters the mapping leaves out are the same on every run
    model = BertGPT(config)
    sd_hf = bert.state_dict()
    mapping = _mapping(config.n_layer)
    h, L = f"transformer.h.{layer}.", f"encoder.layer.{layer}."
    nxt = f"encoder.layer.{(layer + 1) % config.n_layer}."
    untransposed: set[str] = set()
    if fault in ("qk_swapped", "kv_swapped"):
        order = ("key", "query", "value") if fault == "qk_swapped" else ("query", "value", "key")
        for p in ("weight", "bias"):
            mapping[h + "attn.c_attn." + p] = tuple(f"{L}attention.self.{n}.{p}" for n in order)
    elif fault == "layers_out_of_order":
        for key in list(mapping):
            for a, b in ((layer, layer + 1), (layer + 1, layer)):
                if key.startswith(f"transformer.h.{a}."):
                    mapping[key] = tuple(v.replace(f"encoder.layer.{a}.", f"encoder.layer.{b}.")
                                         for v in _mapping(config.n_layer)[key])
    elif fault == "weight_transposed":
        untransposed.add(h + "attn.c_proj.weight")  # forgot that Conv1D stores W transposed
    elif fault == "weight_unloaded":
        del mapping[h + "mlp.c_fc.weight"]
    elif fault == "weight_from_other_layer":
        mapping[h + "mlp.c_proj.weight"] = (f"{nxt}output.dense.weight",)

    sd = model.state_dict()
    for key, sources in mapping.items():
        parts = [sd_hf[s] for s in sources]
        value = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        conv = key.endswith(".weight") and ".c_" in key or key == "pooler.weight"
        if conv and key not in untransposed:
            value = value.t()  # Linear (out, in) -> Conv1D (in, out)
        assert sd[key].shape == value.shape, f"{key}: {sd[key].shape} != {value.shape}"
        with torch.no_grad():
            sd[key].copy_(value)

    block = model.transformer.h[layer]
    if fault == "position_offset":
        model.pos_shift = 1
    elif fault == "token_type_ignored":
        model.segment_uses = 0
    elif fault == "token_type_twice":
        model.segment_uses = 2
    elif fault == "mask_missing":
        model.mask_mode = "none"
    elif fault == "mask_on_query_axis":
        model.mask_mode = "query"
    elif fault == "mask_fill":
        model.mask_value = -2.0  # too small a penalty: padding keeps some attention
    elif fault == "softmax_wrong_dim":
        block.attn.softmax_dim = -2
    elif fault == "scale_1_over_d":
        block.attn.scale = 1.0 / (config.n_embd // config.n_head)
    elif fault == "missing_residual":
        block.residual = False
    elif fault == "pre_ln":
        block.pre_ln = True
    elif fault == "ln_unbiased_var":
        block.ln_1.unbiased = True
    elif fault == "ln_eps":
        block.ln_1.eps = 1e-3
    elif fault == "gelu_tanh":
        block.mlp.gelu = NewGELU()
    elif fault == "pooler_no_tanh":
        model.pool_mode = "cls"
    elif fault == "pooler_mean":
        model.pool_mode = "mean_tanh"
    elif fault == "dropout_active":
        block.attn.force_dropout = True
    return model.eval()
