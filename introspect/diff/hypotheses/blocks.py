"""BERT's blocks recomputed from the reference's own weights, with every porting bug a switch.

Each function returns the block's named intermediates, in the order they are computed, so
that a hypothesis can say which quantity a divergent node holds and re-run the block with
one switch flipped. The defaults reproduce HF's ``BertEmbeddings``, ``BertLayer`` and
``BertPooler`` (post-LayerNorm, erf GELU, additive mask of the dtype's minimum).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

Weights = Mapping[str, torch.Tensor]  # HF parameter names relative to the block


@dataclass(frozen=True)
class LayerOptions:
    """How one encoder layer is computed; the defaults are BERT's."""

    swap: tuple[str, str] | None = None  # projections exchanged, e.g. ("key", "value")
    # "key", "query" (the padded queries' rows), "none", or "repeat": each head masked
    # with another row's padding, the mask repeated per head with ``repeat`` where the
    # heads were folded into the batch row by row (B·nh, S, S)
    mask: str = "key"
    fill: float | None = None  # value for padded positions; None: the dtype's minimum
    fill_added: bool = True  # the fill is added to the scores (else it replaces them)
    softmax_dim: int = -1
    scale: float | None = None  # None: 1/sqrt(head size)
    attention_residual: bool = True
    output_residual: bool = True
    pre_ln: bool = False
    eps: tuple[float | None, float | None] = (None, None)  # attention / output LayerNorm
    unbiased: tuple[bool, bool] = (False, False)
    # "module" (the reference's), "tanh" or "erf" (GELU's), "relu", "silu", "quick"
    # (x * sigmoid(1.702 x), CLIP's QuickGELU)
    activation: str = "module"
    overrides: Mapping[str, torch.Tensor] = field(default_factory=dict)  # weights replaced


class Linears:
    """``F.linear``, answered from the calls of one recorded run where a later run repeats
    one: the same weight and bias (the same tensors) on an input equal bit for bit, laid out
    alike, give the same output bits. The unmodified layer records its run; a variant's run
    on the same rows then computes only the Linears its change reaches (a fill of the mask
    runs no projection, a tanh GELU no Linear at all).
    """

    def __init__(self) -> None:
        self._calls: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor,
                                torch.Tensor]] = []  # weight, bias, input, output
        self._recording = False

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """The calls made inside are kept for later runs to reuse."""
        self._recording = True
        try:
            yield
        finally:
            self._recording = False

    def __call__(self, x: torch.Tensor, weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        for w, b, seen, y in self._calls:
            if w is weight and b is bias and seen.dtype == x.dtype \
                    and seen.shape == x.shape and seen.stride() == x.stride() \
                    and torch.equal(seen, x):
                return y
        y = F.linear(x, weight, bias)
        if self._recording:
            self._calls.append((weight, bias, x, y))
        return y


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               unbiased: bool = False) -> torch.Tensor:
    if not unbiased:
        return F.layer_norm(x, weight.shape, weight, bias, eps)
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=True)
    return (x - mu) / torch.sqrt(var + eps) * weight + bias


def embeddings(w: Weights, input_ids: torch.Tensor, token_type_ids: torch.Tensor, eps: float,
               position_offset: int = 0, token_type_uses: int = 1,
               ln_eps: float | None = None, unbiased: bool = False) -> dict[str, torch.Tensor]:
    """word, token_type, position (1, S, H), word_token_type, sum, embeddings (LayerNorm)."""
    S = input_ids.shape[-1]
    positions = torch.arange(position_offset, S + position_offset).unsqueeze(0)
    out = {"word": F.embedding(input_ids, w["word_embeddings.weight"]),
           "token_type": F.embedding(token_type_ids, w["token_type_embeddings.weight"]),
           "position": F.embedding(positions, w["position_embeddings.weight"])}
    out["word_token_type"] = out["word"] + token_type_uses * out["token_type"]  # HF's first add
    out["sum"] = out["word_token_type"] + out["position"]
    out["embeddings"] = layer_norm(out["sum"], w["LayerNorm.weight"], w["LayerNorm.bias"],
                                   eps if ln_eps is None else ln_eps, unbiased)
    return out


def encoder_layer(w: Weights, x: torch.Tensor, keep: torch.Tensor, heads: int, eps: float,
                  activation: Callable[[torch.Tensor], torch.Tensor],
                  o: LayerOptions = LayerOptions(), stop: str | None = None,
                  linear: Callable[..., torch.Tensor] = F.linear) -> dict[str, torch.Tensor]:
    """One BertLayer: q, k, v, scores, probs, context, attention_dense, attention_sum,
    attention_output, intermediate_dense, intermediate, output_dense, output_sum,
    layer_output (all (B, S, H) or (B, S, I), except scores / probs (B, nh, S, S)).

    ``stop``: the quantity wanted; once it is computed, the layer returns before its next
    matmul (a hypothesis is judged on that one quantity). None: every quantity.
    ``linear``: what computes each Linear (``Linears``, to reuse another run's).
    """
    w = {**w, **o.overrides}
    B, S, H = x.shape
    hd = H // heads
    out: dict[str, torch.Tensor] = {}
    eps1 = eps if o.eps[0] is None else o.eps[0]
    eps2 = eps if o.eps[1] is None else o.eps[1]
    attention_in = x
    if o.pre_ln:
        attention_in = layer_norm(x, w["attention.output.LayerNorm.weight"],
                                  w["attention.output.LayerNorm.bias"], eps1, o.unbiased[0])
    names = {"query": "query", "key": "key", "value": "value"}
    if o.swap:
        a, b = o.swap
        names[a], names[b] = names[b], names[a]
    for short, name in (("q", "query"), ("k", "key"), ("v", "value")):
        source = f"attention.self.{names[name]}"
        out[short] = linear(attention_in, w[f"{source}.weight"], w[f"{source}.bias"])
        if stop in out:
            return out
    q, k, v = (out[n].view(B, S, heads, hd).transpose(1, 2) for n in ("q", "k", "v"))
    scale = 1.0 / math.sqrt(hd) if o.scale is None else o.scale
    scores = q @ k.transpose(-1, -2) * scale  # (B, nh, S, S)
    if o.mask != "none":
        fill = torch.finfo(scores.dtype).min if o.fill is None else o.fill
        if o.mask == "repeat":  # folded index b·nh + h took the mask of row (b·nh + h) mod B
            rows = torch.arange(B * heads).remainder(B).view(B, heads)
            padded = ~keep[rows][:, :, None, :]  # (B, nh, 1, S)
        else:
            padded = ~(keep[:, None, :, None] if o.mask == "query" else keep[:, None, None, :])
        if o.fill_added:
            scores = scores + padded.to(scores.dtype) * fill
        else:
            scores = scores.masked_fill(padded, fill)
    out["scores"] = scores
    out["probs"] = torch.softmax(scores, dim=o.softmax_dim)
    if stop in out:
        return out
    out["context"] = (out["probs"] @ v).transpose(1, 2).reshape(B, S, H)
    if stop in out:
        return out
    out["attention_dense"] = linear(out["context"], w["attention.output.dense.weight"],
                                      w["attention.output.dense.bias"])
    if o.pre_ln:
        out["attention_sum"] = out["attention_output"] = x + out["attention_dense"]
        ffn_in = layer_norm(out["attention_output"], w["output.LayerNorm.weight"],
                            w["output.LayerNorm.bias"], eps2, o.unbiased[1])
    else:
        out["attention_sum"] = out["attention_dense"] + (x if o.attention_residual else 0.0)
        out["attention_output"] = layer_norm(out["attention_sum"],
                                             w["attention.output.LayerNorm.weight"],
                                             w["attention.output.LayerNorm.bias"], eps1,
                                             o.unbiased[0])
        ffn_in = out["attention_output"]
    if stop in out:
        return out
    out["intermediate_dense"] = linear(ffn_in, w["intermediate.dense.weight"],
                                         w["intermediate.dense.bias"])
    act = {"module": activation, "erf": F.gelu,
           "tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, "silu": F.silu,
           "quick": lambda t: t * torch.sigmoid(1.702 * t)}[o.activation]
    out["intermediate"] = act(out["intermediate_dense"])
    if stop in out:
        return out
    out["output_dense"] = linear(out["intermediate"], w["output.dense.weight"],
                                   w["output.dense.bias"])
    residual = out["attention_output"] if o.output_residual else 0.0
    out["output_sum"] = out["output_dense"] + residual
    if o.pre_ln:
        out["layer_output"] = out["output_sum"]
    else:
        out["layer_output"] = layer_norm(out["output_sum"], w["output.LayerNorm.weight"],
                                         w["output.LayerNorm.bias"], eps2, o.unbiased[1])
    return out


def pooler(w: Weights, sequence: torch.Tensor, keep: torch.Tensor, mode: str = "cls",
           tanh: bool = True, dense: bool = True) -> dict[str, torch.Tensor]:
    """first (the pooled token, or a mean), dense, pooled. ``mode``: cls, mean, masked-mean;
    ``dense`` False: no pooler at all, the first token's hidden state is what is pooled."""
    if mode == "cls":
        first = sequence[:, 0]
    elif mode == "mean":
        first = sequence.mean(1)
    else:
        real = keep.unsqueeze(-1).to(sequence.dtype)
        first = (sequence * real).sum(1) / real.sum(1)
    if not dense:
        return {"first": first, "dense": first, "pooled": first}
    projected = F.linear(first, w["dense.weight"], w["dense.bias"])
    return {"first": first, "dense": projected,
            "pooled": torch.tanh(projected) if tanh else projected}


# Which weights each intermediate of a layer has read (for "left unloaded").
READS = {
    "q": ("attention.self.query",), "k": ("attention.self.key",),
    "v": ("attention.self.value",),
    "scores": ("attention.self.query", "attention.self.key"),
    "probs": ("attention.self.query", "attention.self.key"),
    "context": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attention_dense": ("attention.output.dense",),
    "attention_sum": ("attention.output.dense",),
    "attention_output": ("attention.output.dense", "attention.output.LayerNorm"),
    "intermediate_dense": ("intermediate.dense",), "intermediate": ("intermediate.dense",),
    "output_dense": ("output.dense",), "output_sum": ("output.dense",),
    "layer_output": ("output.dense", "output.LayerNorm"),
    "first": (), "dense": ("dense",), "pooled": ("dense",),
    "word": ("word_embeddings",), "token_type": ("token_type_embeddings",),
    "position": ("position_embeddings",),
    "word_token_type": ("word_embeddings", "token_type_embeddings"),
    "sum": ("word_embeddings", "token_type_embeddings", "position_embeddings"),
    "embeddings": ("word_embeddings", "token_type_embeddings", "position_embeddings",
                   "LayerNorm"),
}
