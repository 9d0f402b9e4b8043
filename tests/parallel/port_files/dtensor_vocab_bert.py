"""A BERT encoder made tensor-parallel with ``torch.distributed.tensor``, its word
embedding split on the vocabulary as Megatron's ``VocabParallelEmbedding`` does:
``RowwiseParallel`` on the ``nn.Embedding`` shards its table's rows (dim 0), each rank looks
up the ids that fall in its rows and gives zeros for the others (DTensor's ``_MaskPartial``
placement), and the all-reduce to ``Replicate`` sums the ranks' lookups. The attention and
the MLP are split as in the PyTorch tutorials (``ColwiseParallel`` then ``RowwiseParallel``).

``build_rows_swapped`` is the fault: the table's two halves loaded the other way round, so
each rank looks its ids up in the other rank's rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.head_size = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        q = self.query(x).view(B, S, -1, self.head_size).transpose(1, 2)  # (B, nh, S, hd)
        k = self.key(x).view(B, S, -1, self.head_size).transpose(1, 2)
        v = self.value(x).view(B, S, -1, self.head_size).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, S, hd)
        context = context.transpose(1, 2).reshape(B, S, -1)
        return self.norm(x + self.dense(context))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads, eps)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.norm(x + self.down(F.gelu(self.up(x))))


class Encoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.words = nn.Embedding(config.vocab_size, hidden)
        self.positions = nn.Embedding(config.max_position_embeddings, hidden)
        self.types = nn.Embedding(config.type_vocab_size, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(
            Layer(hidden, config.num_attention_heads, config.intermediate_size, eps)
            for _ in range(config.num_hidden_layers))

    def forward(self, input_ids, token_type_ids, attention_mask):
        S = input_ids.shape[1]
        x = self.words(input_ids) + self.types(token_type_ids) \
            + self.positions(torch.arange(S, device=input_ids.device))[None]
        x = self.norm(x)
        mask = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S): True attends
        for layer in self.layers:
            x = layer(x, mask)
        return x


def _load(encoder: Encoder, hf) -> None:
    """The HF BertModel's weights, key by key."""
    mapping = {"words": "embeddings.word_embeddings", "positions": "embeddings.position_embeddings",
               "types": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm"}
    for i in range(len(encoder.layers)):
        ours, theirs = f"layers.{i}", f"encoder.layer.{i}"
        mapping.update({
            f"{ours}.attention.query": f"{theirs}.attention.self.query",
            f"{ours}.attention.key": f"{theirs}.attention.self.key",
            f"{ours}.attention.value": f"{theirs}.attention.self.value",
            f"{ours}.attention.dense": f"{theirs}.attention.output.dense",
            f"{ours}.attention.norm": f"{theirs}.attention.output.LayerNorm",
            f"{ours}.up": f"{theirs}.intermediate.dense",
            f"{ours}.down": f"{theirs}.output.dense",
            f"{ours}.norm": f"{theirs}.output.LayerNorm",
        })
    source = hf.state_dict()
    state = {}
    for ours, theirs in mapping.items():
        for kind in ("weight", "bias"):
            if f"{theirs}.{kind}" in source:
                state[f"{ours}.{kind}"] = source[f"{theirs}.{kind}"]
    encoder.load_state_dict(state)


def _parallel(encoder: Encoder) -> Encoder:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # the table's rows split across the ranks; each rank's lookup summed into the whole
    parallelize_module(encoder, mesh, {
        "words": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())})
    for layer in encoder.layers:
        parallelize_module(layer, mesh, {
            "attention.query": ColwiseParallel(), "attention.key": ColwiseParallel(),
            "attention.value": ColwiseParallel(), "attention.dense": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel(),
        })
    return encoder.eval()


def build(reference):
    encoder = Encoder(reference.config)
    _load(encoder, reference.model)
    return _parallel(encoder)


def build_rows_swapped(reference):
    encoder = Encoder(reference.config)
    _load(encoder, reference.model)
    with torch.no_grad():  # the bug: the halves of the table the other way round
        table = encoder.words.weight
        table.copy_(torch.cat(table.chunk(2, dim=0)[::-1]))
    return _parallel(encoder)
