"""A BERT port in the sequence-first layout of fairseq and older PyTorch code: (S, B, H).

Written for the tests on purpose, independently of ``introspect`` (it imports only torch).
Everything between the embeddings and the output runs on (S, B, H) tensors: the token
axis first. Heads are folded into the batch, (B * nh, S, hd), and attention is two
``torch.bmm`` calls with ``baddbmm`` for the masked, scaled scores, the way fairseq's
MultiheadAttention computes them. The embeddings are summed in another order (position
first), the LayerNorm is written by hand with its own order of sums, and the layer output
is turned back to (B, S, H) only at the end.

``build(reference, fault=None, layer=0)`` returns the port in eval mode, with weights
from an HF ``BertModel`` through an explicit key mapping; ``fault`` injects one porting
bug into encoder layer ``layer`` (or into the embeddings):

- ``heads_mixed``: heads folded into the batch as (nh * B) where the code reads (B * nh);
- ``mask_wrong_batch``: the padding mask repeated per head in the order of the other fold;
- ``ln_eps``: the LayerNorm's epsilon 1e-5 instead of the checkpoint's 1e-12;
- ``gelu_tanh``: the tanh approximation of GELU;
- ``position_offset``: position ids counted from 1.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FAULTS = ("heads_mixed", "mask_wrong_batch", "ln_eps", "gelu_tanh", "position_offset")


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float) -> torch.Tensor:
    centred = x - x.sum(-1, keepdim=True) / x.shape[-1]
    variance = (centred * centred).sum(-1, keepdim=True) / x.shape[-1]
    return centred * torch.rsqrt(variance + eps) * weight + bias


class Norm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(hidden))
        self.beta = nn.Parameter(torch.zeros(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.gamma, self.beta, self.eps)


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.heads_mixed = False
        self.mask_wrong_batch = False

    def _fold(self, x: torch.Tensor) -> torch.Tensor:
        """(S, B, H) -> (B * nh, S, hd)."""
        S, B, H = x.shape
        x = x.reshape(S, B * self.heads, H // self.heads)  # (S, B*nh, hd): batch-major fold
        if self.heads_mixed:  # read as if heads were the outer fold
            x = x.reshape(S, B, self.heads, -1).transpose(1, 2).reshape(S, B * self.heads, -1)
        return x.transpose(0, 1)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        S, B, H = x.shape
        q, k, v = self._fold(self.q(x)), self._fold(self.k(x)), self._fold(self.v(x))
        if self.mask_wrong_batch:
            mask = padding.repeat(self.heads, 1, 1)  # (nh*B, 1, S): the other fold's order
        else:
            mask = padding.repeat_interleave(self.heads, dim=0)  # (B*nh, 1, S)
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1 / math.sqrt(H // self.heads))
        context = torch.bmm(scores.softmax(dim=-1), v)  # (B*nh, S, hd)
        return self.out(context.transpose(0, 1).reshape(S, B, H))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.norm_1 = Norm(hidden, eps)
        self.fc_1 = nn.Linear(hidden, inner)
        self.fc_2 = nn.Linear(inner, hidden)
        self.norm_2 = Norm(hidden, eps)
        self.gelu = "none"

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = self.norm_1(x + self.attention(x, padding))
        inner = nn.functional.gelu(self.fc_1(x), approximate=self.gelu)
        return self.norm_2(x + self.fc_2(inner))


class SeqFirstBert(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.positions = nn.Embedding(config.max_position_embeddings, H)
        self.tokens = nn.Embedding(config.vocab_size, H)
        self.segments = nn.Embedding(config.type_vocab_size, H)
        self.norm = Norm(H, config.layer_norm_eps)
        self.layers = nn.ModuleList(
            Layer(H, config.num_attention_heads, config.intermediate_size, config.layer_norm_eps)
            for _ in range(config.num_hidden_layers))
        self.position_start = 0

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        ids = input_ids.t()  # (S, B)
        positions = torch.arange(ids.shape[0]) + self.position_start
        x = self.positions(positions)[:, None, :] + self.tokens(ids) \
            + self.segments(token_type_ids.t())
        x = self.norm(x)  # (S, B, H)
        padding = (1.0 - attention_mask[:, None, :].float()) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, padding)
        return x.transpose(0, 1)  # (B, S, H)


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (an HF BertModel), with ``fault`` in ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    port = SeqFirstBert(reference.config)
    state = {k.removeprefix("bert."): v for k, v in reference.state_dict().items()}
    names = {
        "positions.weight": "embeddings.position_embeddings.weight",
        "tokens.weight": "embeddings.word_embeddings.weight",
        "segments.weight": "embeddings.token_type_embeddings.weight",
        "norm.gamma": "embeddings.LayerNorm.weight",
        "norm.beta": "embeddings.LayerNorm.bias",
    }
    for i in range(len(port.layers)):
        hf, mine = f"encoder.layer.{i}.", f"layers.{i}."
        for a, b in (("attention.q", "attention.self.query"), ("attention.k", "attention.self.key"),
                     ("attention.v", "attention.self.value"),
                     ("attention.out", "attention.output.dense"),
                     ("fc_1", "intermediate.dense"), ("fc_2", "output.dense")):
            names[f"{mine}{a}.weight"] = f"{hf}{b}.weight"
            names[f"{mine}{a}.bias"] = f"{hf}{b}.bias"
        for a, b in (("norm_1", "attention.output.LayerNorm"), ("norm_2", "output.LayerNorm")):
            names[f"{mine}{a}.gamma"] = f"{hf}{b}.weight"
            names[f"{mine}{a}.beta"] = f"{hf}{b}.bias"
    own = dict(port.named_parameters())
    assert set(own) == set(names), set(own) ^ set(names)
    with torch.no_grad():
        for mine, theirs in names.items():
            assert own[mine].shape == state[theirs].shape, (mine, theirs)
            own[mine].copy_(state[theirs])
    target = port.layers[layer]
    if fault == "heads_mixed":
        target.attention.heads_mixed = True
    elif fault == "mask_wrong_batch":
        target.attention.mask_wrong_batch = True
    elif fault == "ln_eps":
        target.norm_1.eps = 1e-5
    elif fault == "gelu_tanh":
        target.gelu = "tanh"
    elif fault == "position_offset":
        port.position_start = 1
    return port.eval()
