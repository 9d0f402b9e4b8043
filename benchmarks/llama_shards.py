"""Write a random-init Llama checkpoint, shard by shard, without holding it whole.

The large-model benchmark and its small test need a Llama checkpoint of a given size in
bfloat16 safetensors, on a machine that cannot hold the model twice. Building the HF
model and calling ``save_pretrained`` would hold every weight in float32 first; here the
names and shapes come from the model built on the meta device (no memory), and each
shard's tensors are drawn, written and dropped before the next shard is drawn. Each
tensor is drawn from a generator seeded by its own name, so the checkpoint is the same
whatever the shard size.

Example::

    >>> folder = write_llama_checkpoint(tmp / "llama", LLAMA_3B)
    >>> sorted(p.name for p in folder.iterdir())[:2]
    ['config.json', 'model-00001-of-00014.safetensors']
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

# A Llama of about 3.4e9 parameters (OpenLLaMA 3B's sizes, vocab sized to the embedded
# WordPiece vocab's 30522 ids and up): 6.9 GB of bfloat16 weights.
LLAMA_3B: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 3200, "intermediate_size": 8640,
    "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
# Llama-2-7B's sizes: 6.7e9 parameters, 13.5 GB of bfloat16 weights.
LLAMA_7B: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
# A few-MB Llama with every part of the big ones (grouped-query attention included).
LLAMA_SMALL: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 64, "intermediate_size": 172,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
# The suite's Llama: 86e6 parameters, 172 MB, large enough that a second copy of its weights
# shows over the resident set of torch and transformers themselves.
LLAMA_TEST: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 1024, "intermediate_size": 2816,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}
SHARD_BYTES = 2 * 10**9  # at most this many bytes of tensors drawn and held at once
INIT_STD = 0.02  # HF's initializer_range for Llama


def write_llama_checkpoint(folder: str | Path, sizes: Mapping[str, Any], *,
                           dtype: torch.dtype = torch.bfloat16,
                           shard_bytes: int = SHARD_BYTES, seed: int = 0) -> Path:
    """Write config.json, the safetensors shards and their index into ``folder``.

    Returns:
        The folder, a checkpoint ``introspect diff --model FOLDER`` loads.
    """
    import transformers
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = transformers.LlamaConfig(**sizes, pad_token_id=0, use_cache=False)
    config.dtype = dtype  # what config.json says the weights are (torch_dtype)
    with torch.device("meta"):  # names and shapes only: nothing is allocated
        shapes = {name: tuple(t.shape) for name, t in
                  transformers.LlamaForCausalLM(config).state_dict().items()}
    groups = list(_shards(shapes, torch.finfo(dtype).bits // 8, shard_bytes))
    weight_map, total = {}, 0
    for number, names in enumerate(groups, 1):
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: _draw(name, shapes[name], dtype, seed) for name in names}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file))
        del tensors  # the next shard is drawn only once this one is gone
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config.save_pretrained(folder)
    return folder


def checkpoint_bytes(folder: str | Path) -> int:
    """The bytes of the tensors a checkpoint written here holds (its index's total_size)."""
    index = json.loads((Path(folder) / "model.safetensors.index.json").read_text())
    return int(index["metadata"]["total_size"])


def _shards(shapes: Mapping[str, tuple[int, ...]], itemsize: int,
            limit: int) -> Iterator[list[str]]:
    """Names in order, grouped so that each group's bytes stay under ``limit``."""
    group: list[str] = []
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * int(torch.Size(shape).numel())
        if group and size + nbytes > limit:
            yield group
            group, size = [], 0
        group.append(name)
        size += nbytes
    if group:
        yield group


def _draw(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Norm weights are ones, every other weight N(0, INIT_STD) from a seed of its name."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    generator = torch.Generator().manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=dtype).normal_(0.0, INIT_STD, generator=generator)


__all__ = ["LLAMA_3B", "LLAMA_7B", "LLAMA_SMALL", "LLAMA_TEST", "checkpoint_bytes",
           "write_llama_checkpoint"]
