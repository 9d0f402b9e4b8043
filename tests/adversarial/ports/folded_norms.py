"""BERT with every LayerNorm's gain and shift folded into the Linears that read its
output (imports only torch).

Each LayerNorm becomes ``F.layer_norm`` with no affine; the Linears reading it take
``W * gain`` and ``b + W @ shift``, and the residual stream gets the affine back by
``torch.addcmul(shift, n, gain)``. So the query, key, value and intermediate Linears hold
none of the reference's matrices as they are (each is one with its columns scaled by a
LayerNorm's gain), and each layer's module takes the normalized stream, not the
reference's layer input: module evidence can pair no layer, and the outputs' budget
hides a slip in one layer's attention scale on bert-tiny.

- ``correct``: the same arithmetic;
- ``faulty``: in layer 1, scores scaled by 1/sqrt(d + 1);
- ``correct_einsum`` / ``faulty_einsum``: the folded projections applied by
  ``torch.einsum`` with their folded bias added apart (the product holds neither bias);
- ``correct_transposed`` / ``faulty_transposed``: their weights stored transposed,
  applied by ``torch.addmm``;
- ``correct_fused`` / ``faulty_fused``: query, key and value folded into one fused
  (3H, H) Linear, chunked.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class FoldedLayer(nn.Module):
    def __init__(self, width: int, inner: int, heads: int, eps: float, slip: bool,
                 form: str = "linear") -> None:
        super().__init__()
        self.heads, self.eps, self.slip, self.form = heads, eps, slip, form
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.mix = nn.Linear(width, width)
        self.grow, self.shrink = nn.Linear(width, inner), nn.Linear(inner, width)
        # the affine of the LayerNorm before this layer (on the residual only), and of
        # the one after the attention
        self.gain_in, self.shift_in = nn.Parameter(torch.ones(width)), \
            nn.Parameter(torch.zeros(width))
        self.gain_mid, self.shift_mid = nn.Parameter(torch.ones(width)), \
            nn.Parameter(torch.zeros(width))

    def forward(self, n: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        batch, length, width = n.shape
        size = width // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (self.heads, size)).transpose(1, 2)

        if self.form == "fused":
            q, k, v = (split(t) for t in self.qkv(n).chunk(3, dim=-1))
        else:
            q, k, v = (split(self.project(n, lin))
                       for lin in (self.query, self.key, self.value))
        root = math.sqrt(size + 1 if self.slip else size)
        weights = torch.softmax(q @ k.transpose(-1, -2) / root + blocked, dim=-1)
        context = (weights @ v).transpose(1, 2).flatten(2)
        residual = torch.addcmul(self.shift_in, n, self.gain_in)
        n = F.layer_norm(residual + self.mix(context), (width,), eps=self.eps)
        residual = torch.addcmul(self.shift_mid, n, self.gain_mid)
        return F.layer_norm(residual + self.shrink(F.gelu(self.project(n, self.grow))),
                            (width,), eps=self.eps)

    def project(self, n: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
        """A folded projection, in the form this port writes it."""
        if self.form == "einsum":
            return torch.einsum("bsh,oh->bso", n, linear.weight) + linear.bias
        if self.form == "transposed":
            stored = getattr(self, "t_" + next(k for k, m in self.named_children()
                                                if m is linear))
            return torch.addmm(linear.bias, n.flatten(0, 1), stored).unflatten(0, n.shape[:2])
        return linear(n)

    def fuse(self) -> None:
        """Query, key and value as one (3H, H) Linear (theirs then unused: zeros)."""
        width = self.query.in_features
        self.qkv = nn.Linear(width, 3 * width)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([m.weight for m in (self.query, self.key,
                                                                 self.value)]))
            self.qkv.bias.copy_(torch.cat([m.bias for m in (self.query, self.key,
                                                             self.value)]))
            for m in (self.query, self.key, self.value):
                m.weight.zero_()
                m.bias.zero_()

    def store_transposed(self) -> None:
        """Each folded projection's weight kept transposed, as ``x @ W`` reads it (the
        Linear's own weight is then unused: a zero, so it holds nothing of the
        reference's)."""
        for name in ("query", "key", "value", "grow"):
            linear = getattr(self, name)
            self.register_parameter("t_" + name,
                                    nn.Parameter(linear.weight.detach().t().contiguous()))
            with torch.no_grad():
                linear.weight.zero_()


class FoldedBert(nn.Module):
    def __init__(self, config: Any, slip_layer: int, form: str = "linear") -> None:
        super().__init__()
        width = config.hidden_size
        self.eps = config.layer_norm_eps
        self.words = nn.Embedding(config.vocab_size, width)
        self.places = nn.Embedding(config.max_position_embeddings, width)
        self.kinds = nn.Embedding(config.type_vocab_size, width)
        self.layers = nn.ModuleList(
            FoldedLayer(width, config.intermediate_size, config.num_attention_heads, self.eps,
                        i == slip_layer, form) for i in range(config.num_hidden_layers))
        self.gain_out = nn.Parameter(torch.ones(width))
        self.shift_out = nn.Parameter(torch.zeros(width))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        length = input_ids.shape[1]
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.words(input_ids) + self.kinds(token_type_ids) \
            + self.places(torch.arange(length))[None]
        n = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        blocked = torch.zeros(attention_mask.shape, dtype=n.dtype).masked_fill(
            attention_mask == 0, float("-inf"))[:, None, None, :]
        for layer in self.layers:
            n = layer(n, blocked)
        return {"last_hidden_state": torch.addcmul(self.shift_out, n, self.gain_out)}


def _build(reference: Any, slip_layer: int, form: str = "linear") -> FoldedBert:
    config = reference.config
    model = FoldedBert(config, slip_layer, form)
    hf = {k: v.detach().clone() for k, v in reference.model.state_dict().items()}
    state = {"words.weight": hf["embeddings.word_embeddings.weight"],
             "places.weight": hf["embeddings.position_embeddings.weight"],
             "kinds.weight": hf["embeddings.token_type_embeddings.weight"]}
    gain, shift = hf["embeddings.LayerNorm.weight"], hf["embeddings.LayerNorm.bias"]
    for i in range(config.num_hidden_layers):
        at, mine = f"encoder.layer.{i}.", f"layers.{i}."
        state[mine + "gain_in"], state[mine + "shift_in"] = gain, shift
        for name, theirs in (("query", "attention.self.query"), ("key", "attention.self.key"),
                             ("value", "attention.self.value")):
            weight, bias = hf[at + theirs + ".weight"], hf[at + theirs + ".bias"]
            state[mine + name + ".weight"] = weight * gain
            state[mine + name + ".bias"] = bias + weight @ shift
        state[mine + "mix.weight"] = hf[at + "attention.output.dense.weight"]
        state[mine + "mix.bias"] = hf[at + "attention.output.dense.bias"]
        gain = hf[at + "attention.output.LayerNorm.weight"]
        shift = hf[at + "attention.output.LayerNorm.bias"]
        state[mine + "gain_mid"], state[mine + "shift_mid"] = gain, shift
        weight, bias = hf[at + "intermediate.dense.weight"], hf[at + "intermediate.dense.bias"]
        state[mine + "grow.weight"] = weight * gain
        state[mine + "grow.bias"] = bias + weight @ shift
        state[mine + "shrink.weight"] = hf[at + "output.dense.weight"]
        state[mine + "shrink.bias"] = hf[at + "output.dense.bias"]
        gain, shift = hf[at + "output.LayerNorm.weight"], hf[at + "output.LayerNorm.bias"]
    state["gain_out"], state["shift_out"] = gain, shift
    model.load_state_dict(state)
    for layer in model.layers:
        if form == "transposed":
            layer.store_transposed()
        elif form == "fused":
            layer.fuse()
    return model.eval()


def correct(reference: Any) -> FoldedBert:
    return _build(reference, -1)


def faulty(reference: Any) -> FoldedBert:
    return _build(reference, 1)


def correct_einsum(reference: Any) -> FoldedBert:
    return _build(reference, -1, "einsum")


def faulty_einsum(reference: Any) -> FoldedBert:
    return _build(reference, 1, "einsum")


def correct_transposed(reference: Any) -> FoldedBert:
    return _build(reference, -1, "transposed")


def faulty_transposed(reference: Any) -> FoldedBert:
    return _build(reference, 1, "transposed")


def correct_fused(reference: Any) -> FoldedBert:
    return _build(reference, -1, "fused")


def faulty_fused(reference: Any) -> FoldedBert:
    return _build(reference, 1, "fused")
