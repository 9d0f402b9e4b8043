"""BERT as one function over one flat Parameter, with faults that only one grad mode
takes (imports only torch).

Every weight of the reference is copied into a single 1-D ``nn.Parameter`` named
``packed``, and each use slices it back out and reshapes it (as FSDP's flat parameters and
hand-rolled packers do). There are no submodules: module evidence sees only the whole
model, so only op evidence can find a fault that moves the outputs by less than their
budget. The attention is written out by hand (scores, softmax, weighted sum), the
LayerNorm is ``F.layer_norm``, the GELU is erf's.

- ``correct``: the same arithmetic in every mode;
- ``faulty_grad``: in the second layer, the scores are scaled by 1/sqrt(d + 1), with
  autograd on only (a plain ``model(**x)``);
- ``faulty_inference``: the same slip under ``torch.inference_mode()`` only;
- ``faulty_everywhere``: the same slip in every mode;
- ``faulty_unhooked``: the same slip only where the model has no hooks of its own (a
  recorder that hooks every module takes the other path);
- ``correct_split``: the weights taken by one ``torch.split`` of the packed Parameter per
  call, the pooler's packed too and never used (that piece gets no gradient);
- ``correct_buffer`` / ``faulty_buffer``: packed into a buffer, not a Parameter (a frozen
  inference port), the latter with the slip in every mode;
- ``correct_rows`` / ``faulty_rows``: packed as the rows of one 2-D Parameter as wide as
  the hidden size (a matrix wider than that stored transposed, a long vector as several
  rows), each weight cut back out of it by its rows, the latter with the slip everywhere.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_LAYER = ("attention.self.query", "attention.self.key", "attention.self.value",
          "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
          "output.dense", "output.LayerNorm")


class PackedBert(nn.Module):
    def __init__(self, reference: Any, slip: str = "", split: bool = False,
                 buffer: bool = False, rows: bool = False) -> None:
        super().__init__()
        config = reference.config
        self.heads = config.num_attention_heads
        self.depth = config.num_hidden_layers
        self.eps = config.layer_norm_eps
        self.slip = slip
        state = reference.model.state_dict()
        names = [f"embeddings.{n}.weight" for n in
                 ("word_embeddings", "position_embeddings", "token_type_embeddings")]
        names += ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
        names += [f"encoder.layer.{i}.{part}.{kind}" for i in range(self.depth)
                  for part in _LAYER for kind in ("weight", "bias")]
        self.split = split
        if split:
            names += ["pooler.dense.weight", "pooler.dense.bias"]
        self.where: dict[str, tuple[int, torch.Size]] = {}
        self.rows = rows
        hidden = config.hidden_size
        pieces, start = [], 0
        for name in names:
            value = state[name].detach()
            self.where[name] = (start, value.shape)
            if rows:  # (a wide matrix transposed: its rows as wide as the hidden size)
                value = value.T if value.ndim == 2 and value.shape[1] != hidden else value
                value = value.reshape(-1, hidden)
                start += value.shape[0]
            else:
                start += value.numel()
                value = value.flatten()
            pieces.append(value)
        if buffer:
            self.register_buffer("packed", torch.cat(pieces).clone())
        else:
            self.packed = nn.Parameter(torch.cat(pieces).clone())

    def w(self, name: str) -> torch.Tensor:
        start, shape = self.where[name]
        if self.split:
            return self.pieces[name].reshape(shape)
        if self.rows:
            count = shape.numel() // self.packed.shape[1]
            block = self.packed[start:start + count]
            return block.T if len(shape) == 2 and shape[1] != block.shape[1] \
                else block.reshape(shape)
        return self.packed[start:start + shape.numel()].reshape(shape)

    def slipped(self, layer: int) -> bool:
        if layer != min(1, self.depth - 1):
            return False
        return {"grad": torch.is_grad_enabled() and not torch.is_inference_mode_enabled(),
                "inference": torch.is_inference_mode_enabled(),
                "everywhere": True,
                "unhooked": not (self._forward_hooks or self._forward_pre_hooks),
                }.get(self.slip, False)

    def dense(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return torch.addmm(self.w(name + ".bias"), x.flatten(0, -2),
                           self.w(name + ".weight").T).unflatten(0, x.shape[:-1])

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.w(name + ".weight"), self.w(name + ".bias"),
                            self.eps)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        batch, length = input_ids.shape
        if self.split:
            sizes = [shape.numel() for _, shape in self.where.values()]
            self.pieces = dict(zip(self.where, torch.split(self.packed, sizes), strict=True))
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = (self.w("embeddings.word_embeddings.weight")[input_ids]
             + self.w("embeddings.position_embeddings.weight")[:length].unsqueeze(0)
             + self.w("embeddings.token_type_embeddings.weight")[token_type_ids])
        x = self.norm(x, "embeddings.LayerNorm")
        blocked = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) \
            * torch.finfo(x.dtype).min
        width = x.shape[-1] // self.heads
        for i in range(self.depth):
            at = f"encoder.layer.{i}."

            def split(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(batch, length, self.heads, width).permute(0, 2, 1, 3)

            q = split(self.dense(x, at + "attention.self.query"))
            k = split(self.dense(x, at + "attention.self.key"))
            v = split(self.dense(x, at + "attention.self.value"))
            root = math.sqrt(width + 1) if self.slipped(i) else math.sqrt(width)
            scores = torch.matmul(q, k.transpose(2, 3)) / root + blocked
            mixed = torch.matmul(scores.softmax(dim=-1), v)
            mixed = mixed.permute(0, 2, 1, 3).reshape(batch, length, -1)
            x = self.norm(self.dense(mixed, at + "attention.output.dense") + x,
                          at + "attention.output.LayerNorm")
            inner = self.dense(x, at + "intermediate.dense")
            inner = inner * 0.5 * (1.0 + torch.erf(inner / math.sqrt(2.0)))
            x = self.norm(self.dense(inner, at + "output.dense") + x, at + "output.LayerNorm")
        return {"last_hidden_state": x}


def correct(reference: Any) -> PackedBert:
    return PackedBert(reference).eval()


def faulty_grad(reference: Any) -> PackedBert:
    return PackedBert(reference, "grad").eval()


def faulty_inference(reference: Any) -> PackedBert:
    return PackedBert(reference, "inference").eval()


def faulty_everywhere(reference: Any) -> PackedBert:
    return PackedBert(reference, "everywhere").eval()


def faulty_unhooked(reference: Any) -> PackedBert:
    return PackedBert(reference, "unhooked").eval()


def correct_split(reference: Any) -> PackedBert:
    return PackedBert(reference, split=True).eval()


def correct_buffer(reference: Any) -> PackedBert:
    return PackedBert(reference, buffer=True).eval()


def faulty_buffer(reference: Any) -> PackedBert:
    return PackedBert(reference, "everywhere", buffer=True).eval()


def correct_rows(reference: Any) -> PackedBert:
    return PackedBert(reference, rows=True).eval()


def faulty_rows(reference: Any) -> PackedBert:
    return PackedBert(reference, "everywhere", rows=True).eval()
