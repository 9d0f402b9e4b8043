"""A second NumPy BERT, written apart from examples/numpy_port, that dumps what it computes.

It imports nothing from introspect: it reads the checkpoint's safetensors and config
itself and keeps its intermediates under names of its own, in the order it computes them.
``extras`` also keeps quantities the reference never computes on their own (a projection
before its bias, the residual sum with the bias left out as ONNX Runtime's SkipLayerNorm
takes it); ``half`` runs the matrix products and activations in float16 (LayerNorm and
softmax accumulate in float32, as runtimes do) and dumps float16. ``fault`` injects one
porting bug.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

FAULTS = {
    "ln-eps": "blk1/attn/norm",  # LayerNorm eps 1e-5 instead of the checkpoint's, layer 1
    "gelu-tanh": "blk3/mlp/act",  # tanh approximation of GELU, layer 3
    "weight-transposed": "blk2/attn/out",  # attention output weight not transposed, layer 2
    "mask-ignored": "blk0/attn/ctx",  # the attention mask not applied
    "position-offset": "embed/sum",  # positions counted from 1
}


def _erf(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x, dtype=np.float64).ravel()
    return np.array([math.erf(v) for v in flat]).reshape(np.shape(x))


class Port:
    def __init__(self, folder: Path, *, fault: str | None = None, extras: bool = False,
                 half: bool = False) -> None:
        self.weights = load_file(str(Path(folder) / "model.safetensors"))
        self.cfg = json.loads((Path(folder) / "config.json").read_text())
        self.fault, self.extras = fault, extras
        self.dt = np.float16 if half else np.float32
        self.saved: dict[str, np.ndarray] = {}

    def w(self, key: str) -> np.ndarray:
        return self.weights[key].astype(self.dt)

    def save(self, key: str, value: np.ndarray) -> np.ndarray:
        self.saved[key] = np.array(value, dtype=self.dt)
        return value

    def norm(self, x: np.ndarray, prefix: str, eps: float) -> np.ndarray:
        wide = x.astype(np.float32)
        centred = wide - wide.mean(axis=-1, keepdims=True)
        scaled = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
        return (scaled * self.weights[prefix + ".weight"]
                + self.weights[prefix + ".bias"]).astype(self.dt)

    def dense(self, x: np.ndarray, prefix: str, tag: str, transposed: bool = False) -> np.ndarray:
        weight = self.w(prefix + ".weight")
        product = x @ (weight if transposed else weight.T)
        if self.extras:
            self.save(tag + "/nobias", product)
        return product + self.w(prefix + ".bias")

    def run(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        cfg = self.cfg
        eps = cfg["layer_norm_eps"]
        seq = ids.shape[1]
        start = 1 if self.fault == "position-offset" else 0
        emb = (self.w("embeddings.word_embeddings.weight")[ids]
               + self.w("embeddings.token_type_embeddings.weight")[types]
               + self.w("embeddings.position_embeddings.weight")[start:start + seq][None])
        self.save("embed/sum", emb)
        h = self.save("embed/norm", self.norm(emb, "embeddings.LayerNorm", eps))
        keep = mask.astype(bool)
        if self.fault == "mask-ignored":
            keep = np.ones_like(keep)
        additive = np.where(keep, 0.0, -1e9).astype(np.float32)[:, None, None, :]
        for i in range(cfg["num_hidden_layers"]):
            h = self.block(i, h, additive, eps)
        return self.saved

    def block(self, i: int, h: np.ndarray, additive: np.ndarray, eps: float) -> np.ndarray:
        p = f"encoder.layer.{i}."
        tag = f"blk{i}"
        n_heads = self.cfg["num_attention_heads"]
        b, s, width = h.shape
        size = width // n_heads
        split = {}
        for name, short in (("query", "q"), ("key", "k"), ("value", "v")):
            flat = self.save(f"{tag}/attn/{short}",
                             self.dense(h, p + "attention.self." + name, f"{tag}/attn/{short}"))
            split[short] = flat.reshape(b, s, n_heads, size).transpose(0, 2, 1, 3)
        logits = (split["q"].astype(np.float32) @ split["k"].astype(np.float32)
                  .transpose(0, 1, 3, 2)) / math.sqrt(size) + additive
        logits -= logits.max(axis=-1, keepdims=True)
        weights = np.exp(logits)
        weights /= weights.sum(axis=-1, keepdims=True)
        ctx = self.save(f"{tag}/attn/ctx", (weights.astype(self.dt) @ split["v"]))
        merged = ctx.transpose(0, 2, 1, 3).reshape(b, s, width)
        out = self.save(f"{tag}/attn/out",
                        self.dense(merged, p + "attention.output.dense", f"{tag}/attn/out",
                                   transposed=self.fault == "weight-transposed" and i == 2))
        if self.extras:  # SkipLayerNorm's input: the residual sum, the bias left out
            self.save(f"{tag}/attn/skip", self.saved[f"{tag}/attn/out/nobias"] + h)
        residual = self.save(f"{tag}/attn/residual", out + h)
        layer_eps = 1e-5 if self.fault == "ln-eps" and i == 1 else eps
        h = self.save(f"{tag}/attn/norm",
                      self.norm(residual, p + "attention.output.LayerNorm", layer_eps))
        up = self.save(f"{tag}/mlp/up", self.dense(h, p + "intermediate.dense", f"{tag}/mlp/up"))
        if self.fault == "gelu-tanh" and i == 3:
            inner = math.sqrt(2 / math.pi) * (up + 0.044715 * up ** 3)
            act = 0.5 * up * (1 + np.tanh(inner))
        else:
            act = (0.5 * up * (1 + _erf(up / math.sqrt(2)))).astype(self.dt)
        act = self.save(f"{tag}/mlp/act", act)
        down = self.save(f"{tag}/mlp/down", self.dense(act, p + "output.dense", f"{tag}/mlp/down"))
        residual = self.save(f"{tag}/mlp/residual", down + h)
        return self.save(f"{tag}/out", self.norm(residual, p + "output.LayerNorm", eps))
