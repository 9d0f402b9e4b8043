"""BERT as pytorchic-bert's ``models.py`` writes it, loaded from an HF BERT.

Imports nothing from introspect; written here in that repository's style, not copied
(numpy's ``prod`` became ``math.prod``). What makes it pytorchic-bert:

- ``Config`` a ``NamedTuple`` (``dim``, ``n_layers``, ``n_heads``, ``dim_ff``, ...);
- a hand-written ``LayerNorm`` with parameters ``gamma`` and ``beta`` and its own mean and
  variance (``variance_epsilon`` 1e-12, TF BERT's);
- ``Embeddings`` (``tok_embed``, ``pos_embed``, ``seg_embed``, then the norm);
- ``MultiHeadedSelfAttention`` (``proj_q``, ``proj_k``, ``proj_v``) whose heads come from
  ``split_last`` / ``merge_last`` helpers, an additive padding mask of -10000 (not
  ``finfo.min``), the probabilities kept on the module (``self.scores``) for inspection;
- ``Block``: attention, ``proj``, ``norm1``, ``PositionWiseFeedForward`` (``fc1``, ``fc2``,
  erf ``gelu``), ``norm2``;
- ``Transformer.forward(x, seg, mask)`` (here named ``input_ids``, ``token_type_ids``,
  ``attention_mask``, the names the diff feeds) returns the last hidden states only.

Its checkpoint loader mapped TF BERT variable names; ``load_hf`` maps an HF BERT's keys
the same way, every shape checked.

Faults (each in block ``layer``, or in the embeddings):

- ``qk_swapped``: ``proj_q`` and ``proj_k`` loaded from each other's HF weights;
- ``heads_split_transposed``: ``split_last(x, (-1, n_heads))``, features cut as
  (head size, heads) instead of (heads, head size);
- ``scale_missing``: scores not divided by sqrt(head size);
- ``missing_residual``: ``norm1(proj(h))`` without the block's input added;
- ``gelu_tanh``: the tanh approximation where BERT uses the exact (erf) GELU;
- ``ln_unbiased_var``: ``norm1``'s variance taken unbiased (``x.var()``);
- ``ln_eps``: every LayerNorm with eps 1e-5 (``nn.LayerNorm``'s default) for BERT's 1e-12;
  the embeddings' norm, whose input varies least, is where it shows first;
- ``segment_ignored``: the embeddings leave ``seg_embed`` out.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("qk_swapped", "heads_split_transposed", "scale_missing", "missing_residual",
          "gelu_tanh", "ln_unbiased_var", "ln_eps", "segment_ignored")


class Config(NamedTuple):
    """Configuration for a BERT model."""

    vocab_size: int = 30522  # size of the vocabulary
    dim: int = 768  # dimension of the hidden layers of the Transformer
    n_layers: int = 12  # number of hidden layers
    n_heads: int = 12  # number of heads in multi-headed attention
    dim_ff: int = 768 * 4  # dimension of the intermediate layers of the feed-forward
    p_drop_hidden: float = 0.1  # dropout probability of hidden layers
    p_drop_attn: float = 0.1  # dropout probability of attention
    max_len: int = 512  # longest sequence
    n_segments: int = 2  # number of sentence segments
    eps: float = 1e-12  # the LayerNorms' variance epsilon


def split_last(x: torch.Tensor, shape) -> torch.Tensor:
    """Split the last dimension into ``shape`` (one entry may be -1)."""
    shape = list(shape)
    assert shape.count(-1) <= 1
    if -1 in shape:
        shape[shape.index(-1)] = x.size(-1) // -math.prod(shape)
    return x.view(*x.size()[:-1], *shape)


def merge_last(x: torch.Tensor, n_dims: int) -> torch.Tensor:
    """Merge the last ``n_dims`` dimensions into one."""
    s = x.size()
    assert 1 < n_dims < len(s)
    return x.view(*s[:-n_dims], -1)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU: x * Phi(x), Phi by erf."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class LayerNorm(nn.Module):
    """A LayerNorm module in the TF style (epsilon inside the square root)."""

    def __init__(self, cfg: Config, variance_epsilon: float = 1e-12) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(cfg.dim))
        self.beta = nn.Parameter(torch.zeros(cfg.dim))
        self.variance_epsilon = variance_epsilon
        self.unbiased = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(-1, keepdim=True)
        if self.unbiased:
            s = x.var(-1, keepdim=True)
        else:
            s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.gamma * x + self.beta


class Embeddings(nn.Module):
    """The embedding module from word, position and token_type embeddings."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.dim)  # token embedding
        self.pos_embed = nn.Embedding(cfg.max_len, cfg.dim)  # position embedding
        self.seg_embed = nn.Embedding(cfg.n_segments, cfg.dim)  # segment(token type) embedding
        self.norm = LayerNorm(cfg, cfg.eps)
        self.drop = nn.Dropout(cfg.p_drop_hidden)
        self.segments = True

    def forward(self, x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        seq_len = x.size(1)
        pos = torch.arange(seq_len, dtype=torch.long, device=x.device)
        pos = pos.unsqueeze(0).expand_as(x)  # (S,) -> (B, S)
        e = self.tok_embed(x) + self.pos_embed(pos)
        if self.segments:
            e = e + self.seg_embed(seg)
        return self.drop(self.norm(e))


class MultiHeadedSelfAttention(nn.Module):
    """Multi-Headed Dot Product Attention."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.proj_q = nn.Linear(cfg.dim, cfg.dim)
        self.proj_k = nn.Linear(cfg.dim, cfg.dim)
        self.proj_v = nn.Linear(cfg.dim, cfg.dim)
        self.drop = nn.Dropout(cfg.p_drop_attn)
        self.scores: torch.Tensor | None = None  # for visualization
        self.n_heads = cfg.n_heads
        self.heads_first = True
        self.scaled = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x, q(query), k(key), v(value): (B(batch_size), S(seq_len), D(dim));
        mask: (B(batch_size) x S(seq_len)); * split D(dim) into (H(n_heads), W(width of head)),
        D = H * W."""
        # (B, S, D) -proj-> (B, S, D) -split-> (B, S, H, W) -trans-> (B, H, S, W)
        q, k, v = self.proj_q(x), self.proj_k(x), self.proj_v(x)
        heads = (self.n_heads, -1) if self.heads_first else (-1, self.n_heads)
        q, k, v = (split_last(t, heads).transpose(1, 2) for t in [q, k, v])
        # (B, H, S, W) @ (B, H, W, S) -> (B, H, S, S) -softmax-> (B, H, S, S)
        scores = q @ k.transpose(-2, -1)
        if self.scaled:
            scores = scores / math.sqrt(k.size(-1))
        if mask is not None:
            mask = mask[:, None, None, :].float()
            scores = scores - 10000.0 * (1.0 - mask)
        scores = self.drop(F.softmax(scores, dim=-1))
        # (B, H, S, S) @ (B, H, S, W) -> (B, H, S, W) -trans-> (B, S, H, W)
        h = (scores @ v).transpose(1, 2).contiguous()
        # -merge-> (B, S, D)
        h = merge_last(h, 2)
        self.scores = scores
        return h


class PositionWiseFeedForward(nn.Module):
    """FeedForward Neural Networks for each position."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.dim_ff)
        self.fc2 = nn.Linear(cfg.dim_ff, cfg.dim)
        self.activation = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, S, D) -> (B, S, D_ff) -> (B, S, D)
        return self.fc2(self.activation(self.fc1(x)))


class Block(nn.Module):
    """Transformer Block."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attn = MultiHeadedSelfAttention(cfg)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm1 = LayerNorm(cfg, cfg.eps)
        self.pwff = PositionWiseFeedForward(cfg)
        self.norm2 = LayerNorm(cfg, cfg.eps)
        self.drop = nn.Dropout(cfg.p_drop_hidden)
        self.residual = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.attn(x, mask)
        h = self.drop(self.proj(h))
        h = self.norm1(x + h if self.residual else h)
        h = self.norm2(h + self.drop(self.pwff(h)))
        return h


class Transformer(nn.Module):
    """Transformer with Self-Attentive Blocks."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = Embeddings(cfg)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            h = block(h, attention_mask)
        return h


def _key_map(n_layers: int) -> dict[str, str]:
    """Our parameter name -> HF BERT's (without the ``bert.`` of its heads)."""
    names = {
        "embed.tok_embed.weight": "embeddings.word_embeddings.weight",
        "embed.pos_embed.weight": "embeddings.position_embeddings.weight",
        "embed.seg_embed.weight": "embeddings.token_type_embeddings.weight",
        "embed.norm.gamma": "embeddings.LayerNorm.weight",
        "embed.norm.beta": "embeddings.LayerNorm.bias",
    }
    for i in range(n_layers):
        ours, theirs = f"blocks.{i}.", f"encoder.layer.{i}."
        for mine, hf in (("attn.proj_q", "attention.self.query"),
                         ("attn.proj_k", "attention.self.key"),
                         ("attn.proj_v", "attention.self.value"),
                         ("proj", "attention.output.dense"),
                         ("pwff.fc1", "intermediate.dense"),
                         ("pwff.fc2", "output.dense")):
            for p in ("weight", "bias"):
                names[f"{ours}{mine}.{p}"] = f"{theirs}{hf}.{p}"
        for mine, hf in (("norm1", "attention.output.LayerNorm"), ("norm2", "output.LayerNorm")):
            names[f"{ours}{mine}.gamma"] = f"{theirs}{hf}.weight"
            names[f"{ours}{mine}.beta"] = f"{theirs}{hf}.bias"
    return names


def load_hf(model: Transformer, hf_model: nn.Module, swap: dict[str, str] | None = None) -> None:
    """Copy an HF BERT's weights into ``model``; ``swap`` reroutes some of our names."""
    state = hf_model.state_dict()
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    ours = dict(model.named_parameters())
    names = _key_map(len(model.blocks))
    assert set(names) == set(ours), set(names) ^ set(ours)
    with torch.no_grad():
        for mine in names:
            w = state[prefix + names[(swap or {}).get(mine, mine)]]
            assert w.shape == ours[mine].shape, (mine, tuple(w.shape), tuple(ours[mine].shape))
            ours[mine].copy_(w)


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (HF ``BertModel`` or ``BertFor*``), with
    ``fault`` in block ``layer`` (or the embeddings)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    if not isinstance(reference, nn.Module):  # the CLI hands over its loaded reference
        reference = reference.model
    c = reference.config
    if c.hidden_act != "gelu" or getattr(c, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("pytorchic-bert has the erf GELU and absolute positions only; this "
                         f"config has {c.hidden_act!r} and {c.position_embedding_type!r}")
    cfg = Config(vocab_size=c.vocab_size, dim=c.hidden_size, n_layers=c.num_hidden_layers,
                 n_heads=c.num_attention_heads, dim_ff=c.intermediate_size,
                 max_len=c.max_position_embeddings, n_segments=c.type_vocab_size,
                 eps=c.layer_norm_eps)
    model = Transformer(cfg)
    swap = None
    if fault == "qk_swapped":
        q, k = f"blocks.{layer}.attn.proj_q", f"blocks.{layer}.attn.proj_k"
        swap = {f"{a}.{p}": f"{b}.{p}" for a, b in ((q, k), (k, q)) for p in ("weight", "bias")}
    load_hf(model, reference, swap)
    block = model.blocks[layer]
    if fault == "heads_split_transposed":
        block.attn.heads_first = False
    elif fault == "scale_missing":
        block.attn.scaled = False
    elif fault == "missing_residual":
        block.residual = False
    elif fault == "gelu_tanh":
        block.pwff.activation = gelu_tanh
    elif fault == "ln_unbiased_var":
        block.norm1.unbiased = True
    elif fault == "ln_eps":  # every norm, as nn.LayerNorm's default would give
        for m in model.modules():
            if isinstance(m, LayerNorm):
                m.variance_epsilon = 1e-5
    elif fault == "segment_ignored":
        model.embed.segments = False
    return model.eval()
