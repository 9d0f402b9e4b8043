"""The query and key vectors behind each attention map, for bertviz's neuron view.

The neuron view shows, for one head and one query token, the query vector, every key
vector, their elementwise product and the scores: why the head looks where it looks.
The vectors are read from the same traced graph as the probabilities:

- at a ``scaled_dot_product_attention`` call: its ``query`` and ``key`` arguments, and
  its ``scale`` (``1/sqrt(hd)`` when not given);
- at an eager attention softmax: walking back from the softmax through the additive
  mask and the scaling (``* c``, ``/ c``) to the ``matmul(q, k.transpose(-1, -2))``.

A graph where that walk finds no plain ``q·kᵀ`` has no neuron view; the maps say so.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

_MATMULS = (torch.matmul, operator.matmul, torch.bmm)
_ADDS = (operator.add, torch.add, operator.sub, torch.sub)
_PASS_THROUGH = ("masked_fill", "float", "to", "type_as", "contiguous")


@dataclass(frozen=True)
class QueryKey:
    """Where one attention's query and key come from, and its score scale."""

    query: torch.fx.Node  # (B, nh, S, hd)
    key: torch.fx.Node  # (B, nh_kv, S, hd): fewer heads under grouped-query attention
    scale: float | None  # None: 1/sqrt(hd), as sdpa's default


def query_key_of(node: torch.fx.Node) -> QueryKey | None:
    """The query and key an attention node (sdpa call or softmax) scores, or None."""
    if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
        query = node.kwargs.get("query", node.args[0] if node.args else None)
        key = node.kwargs.get("key", node.args[1] if len(node.args) > 1 else None)
        scale = node.kwargs.get("scale", node.args[6] if len(node.args) > 6 else None)
        if not isinstance(query, torch.fx.Node) or not isinstance(key, torch.fx.Node):
            return None
        if scale is not None and not isinstance(scale, (int, float)):
            return None  # a scale computed in the graph: not read here
        return QueryKey(query, key, None if scale is None else float(scale))
    x = node.args[0] if node.args else node.kwargs.get("input")
    scale = 1.0
    for _ in range(12):  # a few ops at most between the scores and the softmax
        if not isinstance(x, torch.fx.Node):
            return None
        if _is(x, _MATMULS, "matmul"):
            return _scores(x, scale)
        if _is(x, _ADDS, "add") or _is(x, (), "sub"):
            x = x.args[0]  # the scores first, the mask added to them
        elif _is(x, (operator.mul, torch.mul), "mul"):
            x, factor = _node_and_number(x.args)
            if factor is None:
                return None
            scale *= factor
        elif _is(x, (operator.truediv, torch.div), "div"):
            divisor = x.args[1] if len(x.args) > 1 else None
            if not isinstance(divisor, (int, float)) or divisor == 0:
                return None
            x, scale = x.args[0], scale / float(divisor)
        elif x.op == "call_method" and x.target in _PASS_THROUGH:
            x = x.args[0]
        else:
            return None
    return None


def _is(node: torch.fx.Node, functions: tuple[Any, ...], method: str) -> bool:
    return (node.op == "call_function" and node.target in functions) or \
        (node.op == "call_method" and node.target == method)


def _node_and_number(args: Any) -> tuple[Any, float | None]:
    a, b = (args[0], args[1]) if len(args) > 1 else (None, None)
    if isinstance(a, torch.fx.Node) and isinstance(b, (int, float)):
        return a, float(b)
    if isinstance(b, torch.fx.Node) and isinstance(a, (int, float)):
        return b, float(a)
    return None, None


def _scores(matmul: torch.fx.Node, scale: float) -> QueryKey | None:
    """``matmul(q, kᵀ)``: the key is what the transpose of the last two axes reads."""
    query, transposed = matmul.args[0], matmul.args[1]
    if not isinstance(query, torch.fx.Node) or not isinstance(transposed, torch.fx.Node):
        return None
    if not _swaps_last_two(transposed):
        return None
    key = transposed.args[0]
    return QueryKey(query, key, scale) if isinstance(key, torch.fx.Node) else None


def _swaps_last_two(node: torch.fx.Node) -> bool:
    if _is(node, (torch.transpose,), "transpose"):
        dims = tuple(node.args[1:3])
        return dims in ((-1, -2), (-2, -1), (2, 3), (3, 2))
    return node.op == "call_function" and node.target is getattr and \
        node.args[1:] == ("mT",)


def head_vectors(query: torch.Tensor, key: torch.Tensor,
                 scale: float | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``query`` and ``key`` as float32 ``(B, nh, S, hd)`` (key heads shared out under
    grouped-query attention), and the scale of their scores."""
    if key.shape[-3] != query.shape[-3]:
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    return query.float(), key.float(), 1.0 / math.sqrt(query.shape[-1]) if scale is None \
        else scale


__all__ = ["QueryKey", "head_vectors", "query_key_of"]
