"""A Megatron-style tensor-parallel BERT encoder, written the way Megatron-LM writes it.

Run under torch.distributed (one process per rank). The attention's query, key and value
and the MLP's first Linear are column-parallel (each rank holds out_features / N rows of
the weight, so its heads, or its slice of the intermediate features); the attention's
output Linear and the MLP's second Linear are row-parallel (each rank holds in_features / N
columns, computes a partial product, and an all-reduce sums the partials before the bias
is added once). Embeddings, LayerNorms and the pooler are replicated.

``build(reference)`` takes the HF ``BertModel`` a diff tool hands it (``reference.model``)
and slices its weights for this rank. The other builders are the faults seen in real
ports: an all-reduce left out, a bias added on every rank before the sum.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _rank_slice(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    """This rank's contiguous block of ``tensor`` along ``dim``."""
    return tensor.chunk(dist.get_world_size(), dim=dim)[dist.get_rank()].clone()


class ColumnParallelLinear(nn.Module):
    """Y_r = X A_r^T + b_r: the output features split across ranks, no communication."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(_rank_slice(linear.weight.detach(), 0))
        self.bias = nn.Parameter(_rank_slice(linear.bias.detach(), 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = sum_r X_r A_r^T + b: each rank's partial product, summed by an all-reduce."""

    def __init__(self, linear: nn.Linear, reduce: bool = True,
                 bias_before_sum: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(_rank_slice(linear.weight.detach(), 1))
        self.bias = nn.Parameter(linear.bias.detach().clone())
        self.reduce = reduce
        self.bias_before_sum = bias_before_sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias_before_sum:  # the bug: every rank adds the whole bias
            out = F.linear(x, self.weight, self.bias)
            dist.all_reduce(out)
            return out
        out = F.linear(x, self.weight)
        if self.reduce:
            dist.all_reduce(out)
        return out + self.bias


class GatheredDense(nn.Module):
    """The other layout: gather every rank's context (all_gather), then one whole Linear,
    replicated, as ``ColumnParallelLinear(gather_output=True)`` feeding a plain layer."""

    def __init__(self, linear: nn.Linear, reverse: bool = False) -> None:
        super().__init__()
        self.dense = nn.Linear(linear.in_features, linear.out_features)
        self.dense.load_state_dict(linear.state_dict())
        self.reverse = reverse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shards = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(shards, x.contiguous())
        if self.reverse:  # the bug: the shards concatenated last rank first
            shards = shards[::-1]
        return self.dense(torch.cat(shards, dim=-1))


class ParallelSelfAttention(nn.Module):
    """Multi-head attention over this rank's heads (num_heads / N of them)."""

    def __init__(self, layer, num_heads: int, gather: bool = False, reverse: bool = False,
                 **faults) -> None:
        super().__init__()
        attention = layer.attention
        self.heads = num_heads // dist.get_world_size()
        self.head_size = attention.self.query.out_features // num_heads
        self.query = ColumnParallelLinear(attention.self.query)
        self.key = ColumnParallelLinear(attention.self.key)
        self.value = ColumnParallelLinear(attention.self.value)
        self.dense = GatheredDense(attention.output.dense, reverse) if gather \
            else RowParallelLinear(attention.output.dense, **faults)
        self.LayerNorm = _copy_norm(attention.output.LayerNorm)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, S, nh_r * hd) -> (B, nh_r, S, hd)
            return t.view(B, S, self.heads, self.head_size).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + mask  # (B, nh_r, S, S)
        context = scores.softmax(dim=-1) @ v  # (B, nh_r, S, hd)
        context = context.transpose(1, 2).reshape(B, S, self.heads * self.head_size)
        return self.LayerNorm(self.dense(context) + x)


class ParallelMLP(nn.Module):
    def __init__(self, layer, **faults) -> None:
        super().__init__()
        self.up = ColumnParallelLinear(layer.intermediate.dense)
        self.down = RowParallelLinear(layer.output.dense, **faults)
        self.LayerNorm = _copy_norm(layer.output.LayerNorm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.down(F.gelu(self.up(x))) + x)


class ParallelLayer(nn.Module):
    def __init__(self, layer, num_heads: int, attention_faults: dict, mlp_faults: dict) -> None:
        super().__init__()
        self.attention = ParallelSelfAttention(layer, num_heads, **attention_faults)
        self.mlp = ParallelMLP(layer, **mlp_faults)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attention(x, mask))


class ParallelBert(nn.Module):
    """BertModel's forward: (last_hidden_state, pooler_output)."""

    def __init__(self, hf, faults: dict[int, dict] | None = None) -> None:
        super().__init__()
        faults = faults or {}
        config = hf.config
        self.word_embeddings = _copy_embedding(hf.embeddings.word_embeddings)
        self.position_embeddings = _copy_embedding(hf.embeddings.position_embeddings)
        self.token_type_embeddings = _copy_embedding(hf.embeddings.token_type_embeddings)
        self.embeddings_norm = _copy_norm(hf.embeddings.LayerNorm)
        self.layers = nn.ModuleList(
            ParallelLayer(layer, config.num_attention_heads,
                          faults.get(i, {}).get("attention", {}), faults.get(i, {}).get("mlp", {}))
            for i, layer in enumerate(hf.encoder.layer))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.pooler.load_state_dict(hf.pooler.dense.state_dict())

    def forward(self, input_ids, token_type_ids, attention_mask):
        B, S = input_ids.shape
        positions = torch.arange(S).unsqueeze(0)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) \
            + self.position_embeddings(positions)
        x = self.embeddings_norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


def _copy_embedding(embedding: nn.Embedding) -> nn.Embedding:
    copy = nn.Embedding(embedding.num_embeddings, embedding.embedding_dim)
    copy.load_state_dict(embedding.state_dict())
    return copy


def _copy_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    copy.load_state_dict(norm.state_dict())
    return copy


def build(reference):
    """The correct port."""
    return ParallelBert(reference.model).eval()


def build_missing_all_reduce(reference):
    """Layer 2's attention output Linear never sums its partials: each rank goes on alone."""
    return ParallelBert(reference.model, {2: {"attention": {"reduce": False}}}).eval()


def build_bias_before_sum(reference):
    """Layer 1's MLP output Linear adds its whole bias on every rank, then all-reduces."""
    return ParallelBert(reference.model, {1: {"mlp": {"bias_before_sum": True}}}).eval()


def build_gathered(reference):
    """Layer 0 gathers the heads' context and applies its whole output Linear on every rank."""
    return ParallelBert(reference.model, {0: {"attention": {"gather": True}}}).eval()


def build_gathered_in_reverse(reference):
    """As build_gathered, but the gathered shards are concatenated in the wrong order."""
    return ParallelBert(reference.model,
                        {0: {"attention": {"gather": True, "reverse": True}}}).eval()
