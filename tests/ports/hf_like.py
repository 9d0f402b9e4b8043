"""A BERT port written the way many people write one: HF's structure, other names.

Written for the tests on purpose, independently of ``introspect`` (it imports only torch):
``Encoder.blocks[i].attn.q_proj``, ``ln_1``, ``mlp.fc_in`` instead of HF's
``encoder.layer[i].attention.self.query``, ``attention.output.LayerNorm``,
``intermediate.dense``; separate q/k/v Linears and ``F.scaled_dot_product_attention``.
Weights come from an HF ``BertModel`` (or ``BertFor*``) through an explicit key mapping
with every shape checked.

``build(reference, fault=None, layer=0)`` returns the port in eval mode; ``fault`` injects
one classic porting bug (see ``FAULTS``) into encoder layer ``layer`` (or into the
embeddings / pooler where the bug lives there).
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
class PortConfig:
    vocab: int  # word pieces
    hidden: int  # H
    layers: int  # encoder blocks
    heads: int  # nh
    intermediate: int  # MLP width
    positions: int  # learned positions
    types: int  # segments
    eps: float  # LayerNorm epsilon

    @classmethod
    def from_hf(cls, config) -> PortConfig:
        return cls(config.vocab_size, config.hidden_size, config.num_hidden_layers,
                   config.num_attention_heads, config.intermediate_size,
                   config.max_position_embeddings, config.type_vocab_size,
                   config.layer_norm_eps)


class UnbiasedLayerNorm(nn.LayerNorm):
    """LayerNorm normalising by the unbiased variance (a porting bug: torch.var's default)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)  # unbiased: divides by H - 1
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


class TokenEmbedder(nn.Module):
    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.positions, cfg.hidden)
        self.segments = nn.Embedding(cfg.types, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.position_offset = 0
        self.segment_times = 1

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        position_ids = torch.arange(S, device=input_ids.device).unsqueeze(0)  # (1, S)
        if self.position_offset:
            position_ids = position_ids + self.position_offset
        x = self.tokens(input_ids)  # (B, S, H)
        for _ in range(self.segment_times):
            x = x + self.segments(token_type_ids)
        x = x + self.positions(position_ids)
        return self.norm(x)


class Attention(nn.Module):
    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.nh, self.hd = cfg.heads, cfg.hidden // cfg.heads
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.k_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.v_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.out_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.scale = 1.0 / math.sqrt(self.hd)
        self.dropout_p = 0.0
        self.softmax_dim = -1  # only the explicit path can get this wrong

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        B, S, H = x.shape
        q = self.q_proj(x).view(B, S, self.nh, self.hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.k_proj(x).view(B, S, self.nh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nh, self.hd).transpose(1, 2)
        if self.softmax_dim != -1:
            scores = q @ k.transpose(-2, -1) * self.scale  # (B, nh, S, S)
            if bias is not None:
                scores = scores + bias
            y = torch.softmax(scores, dim=self.softmax_dim) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale,
                                               dropout_p=self.dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, S, H)  # (B, S, H)
        return self.out_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.hidden, cfg.intermediate)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(cfg.intermediate, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(x)))


class Block(nn.Module):
    """Post-LayerNorm, as BERT: x = ln_1(x + attn(x)); x = ln_2(x + mlp(x))."""

    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.attn = Attention(cfg)
        self.ln_1 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.mlp = MLP(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.residual = True
        self.pre_ln = False

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x), bias)
            return x + self.mlp(self.ln_2(x))
        h = self.attn(x, bias)
        x = self.ln_1(x + h) if self.residual else self.ln_1(h)
        return self.ln_2(x + self.mlp(x))


class Encoder(nn.Module):
    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.order = list(range(cfg.layers))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        for i in self.order:
            x = self.blocks[i](x, bias)
        return x


class Pooler(nn.Module):
    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.tanh = True
        self.mean = False

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.mean:
            keep = attention_mask.unsqueeze(-1).to(x.dtype)  # (B, S, 1)
            first = (x * keep).sum(1) / keep.sum(1)
        else:
            first = x[:, 0]  # (B, H): the [CLS] token
        y = self.proj(first)
        return torch.tanh(y) if self.tanh else y


class PortedBert(nn.Module):
    """Returns ``(sequence_output, pooled_output)``."""

    def __init__(self, cfg: PortConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = TokenEmbedder(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = Pooler(cfg)
        self.mask_axis = "key"  # "key", "query" or "none"
        self.mask_fill = None  # None: the dtype's lowest value

    def attention_bias(self, attention_mask: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor | None:
        if self.mask_axis == "none":
            return None
        fill = torch.finfo(dtype).min if self.mask_fill is None else self.mask_fill
        blocked = (1.0 - attention_mask.to(dtype)) * fill  # (B, S)
        if self.mask_axis == "query":
            return blocked[:, None, :, None]  # (B, 1, S, 1)
        return blocked[:, None, None, :]  # (B, 1, 1, S)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids, token_type_ids)
        x = self.encoder(x, self.attention_bias(attention_mask, x.dtype))
        return x, self.pooler(x, attention_mask)


def _key_map(cfg: PortConfig) -> dict[str, str]:
    """Port parameter -> HF BertModel parameter."""
    keys = {
        "embed.tokens.weight": "embeddings.word_embeddings.weight",
        "embed.positions.weight": "embeddings.position_embeddings.weight",
        "embed.segments.weight": "embeddings.token_type_embeddings.weight",
        "embed.norm.weight": "embeddings.LayerNorm.weight",
        "embed.norm.bias": "embeddings.LayerNorm.bias",
        "pooler.proj.weight": "pooler.dense.weight",
        "pooler.proj.bias": "pooler.dense.bias",
    }
    parts = {
        "attn.q_proj": "attention.self.query", "attn.k_proj": "attention.self.key",
        "attn.v_proj": "attention.self.value", "attn.out_proj": "attention.output.dense",
        "ln_1": "attention.output.LayerNorm", "mlp.fc_in": "intermediate.dense",
        "mlp.fc_out": "output.dense", "ln_2": "output.LayerNorm",
    }
    for i in range(cfg.layers):
        for mine, theirs in parts.items():
            for p in ("weight", "bias"):
                keys[f"encoder.blocks.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return keys


def _bert_state(reference: nn.Module) -> tuple[dict[str, torch.Tensor], object]:
    base = getattr(reference, "bert", reference)
    return base.state_dict(), base.config


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> PortedBert:
    """The port holding ``reference``'s weights, with ``fault`` injected (None: correct)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    state, config = _bert_state(reference)
    cfg = PortConfig.from_hf(config)
    port = PortedBert(cfg)
    keys = _key_map(cfg)
    mine, theirs = f"encoder.blocks.{layer}.", f"encoder.layer.{layer}."
    other = f"encoder.layer.{(layer + 1) % cfg.layers}."
    transpose: set[str] = set()
    if fault == "qk_swapped":
        for p in ("weight", "bias"):
            keys[f"{mine}attn.q_proj.{p}"] = f"{theirs}attention.self.key.{p}"
            keys[f"{mine}attn.k_proj.{p}"] = f"{theirs}attention.self.query.{p}"
    elif fault == "kv_swapped":
        for p in ("weight", "bias"):
            keys[f"{mine}attn.k_proj.{p}"] = f"{theirs}attention.self.value.{p}"
            keys[f"{mine}attn.v_proj.{p}"] = f"{theirs}attention.self.key.{p}"
    elif fault == "weight_transposed":
        transpose.add(f"{mine}attn.out_proj.weight")
    elif fault == "weight_unloaded":
        del keys[f"{mine}mlp.fc_in.weight"]
    elif fault == "weight_from_other_layer":
        keys[f"{mine}mlp.fc_out.weight"] = f"{other}output.dense.weight"

    own = port.state_dict()
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, tensor in own.items():
            if name not in keys:  # left as initialised: random, but the same on every run
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.02)
                continue
            value = state[keys[name]]
            if name in transpose:
                value = value.t()
            if value.shape != tensor.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} but {keys[name]} "
                                 f"has {tuple(value.shape)}")
            tensor.copy_(value)

    block = port.encoder.blocks[layer]
    if fault == "position_offset":
        port.embed.position_offset = 1
    elif fault == "token_type_ignored":
        port.embed.segment_times = 0
    elif fault == "token_type_twice":
        port.embed.segment_times = 2
    elif fault == "mask_missing":
        port.mask_axis = "none"
    elif fault == "mask_on_query_axis":
        port.mask_axis = "query"
    elif fault == "mask_fill":
        port.mask_fill = -1.0  # the 0/1 mask added as it is, shifted: -1 where padded
    elif fault == "softmax_wrong_dim":
        block.attn.softmax_dim = -2
    elif fault == "scale_1_over_d":
        block.attn.scale = 1.0 / block.attn.hd
    elif fault == "missing_residual":
        block.residual = False
    elif fault == "pre_ln":
        block.pre_ln = True
    elif fault == "ln_unbiased_var":
        norm = UnbiasedLayerNorm(cfg.hidden, eps=cfg.eps)
        norm.load_state_dict(block.ln_1.state_dict())
        block.ln_1 = norm
    elif fault == "ln_eps":
        block.ln_1.eps = 1e-3  # a typo-sized eps: BERT uses 1e-12
    elif fault == "gelu_tanh":
        block.mlp.act = nn.GELU(approximate="tanh")
    elif fault == "pooler_no_tanh":
        port.pooler.tanh = False
    elif fault == "pooler_mean":
        port.pooler.mean = True
    elif fault == "layers_out_of_order":
        order = port.encoder.order
        order[layer], order[layer + 1] = order[layer + 1], order[layer]
    elif fault == "dropout_active":
        block.attn.dropout_p = 0.1  # sdpa's dropout applies whatever the module's mode
    return port.eval()
