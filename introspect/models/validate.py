"""Cheap checks on what a user hands in, made before anything large is loaded or allocated.

- files of a checkpoint folder: regular files that resolve inside the folder, read with a
  size cap (a ``config.json`` linked to ``/dev/zero`` is refused, not read forever);
- ``config.json`` values: types, ranges, divisibility, known activations;
- the model a config describes: its parameter count against this machine's memory;
- weights files: safetensors headers (keys, shapes, offsets) checked without reading a
  tensor; ``pytorch_model.bin`` opened with ``weights_only=True`` only, memory-mapped;
- the layers and embedding shapes the weights hold against those the config asks for;
- texts.

Every failure is a ``ModelSourceError`` (or ``InputError`` for texts) of one line naming
the file, the value and what to do. Used by both loaders (``introspect.models.load`` and
``introspect.scratch.loading``), so it imports nothing from transformers.

Example::

    >>> values = read_config(folder)          # size-capped, inside the folder
    >>> check_config(values, activations=("gelu",), source="config.json")
    >>> check_model_size(values, source="config.json")   # ~1.3e8 parameters: fine
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import warnings
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from introspect.errors import InputError, ModelSourceError

CONFIG_LIMIT = 16 * 2**20  # config.json, shard indexes, tokenizer configs
TOKENIZER_LIMIT = 256 * 2**20  # vocab.txt, tokenizer.json
SAFETENSORS_HEADER_LIMIT = 100 * 2**20  # the safetensors library's own cap
MAX_LABELS = 1_000_000  # num_labels / id2label entries
MEMORY_SHARE = 0.5  # a model may take this share of the memory available now
# Memory-mapped weights (safetensors loaded in their own dtype) are read in place, once:
# they may take this share, the rest is for the activations, torch and the candidate.
MAPPED_SHARE = 0.9
BYTES_PER_PARAMETER = 4  # float32
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")

# Sizes that must be positive integers, and the others config.json may hold.
_POSITIVE_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "max_position_embeddings", "type_vocab_size")
_PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
_SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                       "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1,
                       "F8_E4M3": 1, "F8_E5M2": 1}
# Per-layer weights: BERT, RoBERTa, ELECTRA (encoder.layer.N), DistilBERT
# (transformer.layer.N), GPT-2 (h.N), Llama (layers.N); ALBERT's one shared layer has none.
_LAYER_KEY = re.compile(r"(?:^|\.)(?:encoder\.layer|transformer\.layer|h|layers)\.(\d+)\.")
# The cousins' config keys under BERT's names (DistilBERT, GPT-2, Llama), for the checks.
_BERT_NAMES = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
               "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size",
               "n_embd": "hidden_size", "n_layer": "num_hidden_layers",
               "n_head": "num_attention_heads", "n_inner": "intermediate_size",
               "n_positions": "max_position_embeddings", "activation": "hidden_act",
               "activation_function": "hidden_act", "layer_norm_epsilon": "layer_norm_eps",
               "rms_norm_eps": "layer_norm_eps", "dropout": "hidden_dropout_prob",
               "attention_dropout": "attention_probs_dropout_prob"}


def bert_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """A config with the cousins' own keys (``n_layer``, ``dim``, ...) renamed to BERT's.

    BERT's own keys win where a config has both; values are not touched, so every check
    of ``check_config`` applies to the cousins' values as it does to BERT's.
    """
    renamed = dict(values)
    for key, bert_key in _BERT_NAMES.items():
        if key in values and bert_key not in values:
            renamed[bert_key] = values[key]
    if renamed.get("n_inner", 0) is None:  # GPT-2: None means 4 x hidden
        renamed.pop("intermediate_size", None)
    return renamed


# ----------------------------------------------------------------------------------------
# Files of a checkpoint folder


def checkpoint_root(folder: str | os.PathLike[str]) -> Path:
    """The folder a checkpoint's files must resolve inside.

    The folder itself; for a snapshot of the Hugging Face cache
    (``models--owner--name/snapshots/REV``), whose files link into ``../../blobs``,
    the ``models--owner--name`` folder.
    """
    real = Path(os.path.realpath(folder))
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder of hub id ``repo_id`` (revision main) in the local HF cache.

    Reads the cache only (``refs/main`` and the snapshot's files), never the network;
    None when the id is not cached or is no hub id. huggingface_hub is imported only here.
    """
    if repo_id.count("/") > 1 or repo_id.startswith(("/", ".")) or not repo_id.strip():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # not installed, or an id the hub would refuse (bad characters)
        return None
    return Path(found).parent if isinstance(found, str) else None


def read_checkpoint_file(path: Path, root: Path, *, limit: int, what: str = "") -> bytes:
    """The bytes of a small file of a checkpoint: regular, inside ``root``, under ``limit``.

    Raises:
        ModelSourceError: it resolves outside ``root``, is not a regular file (a link to
            ``/dev/zero``, a FIFO, a folder), is larger than ``limit`` or cannot be read.
    """
    shown = what or str(path)
    real = check_inside(path, root, shown)
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ModelSourceError(f"cannot read {shown!r}: {e.strerror or e}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelSourceError(f"{shown!r} is not a regular file; a checkpoint holds "
                                   f"plain files")
        if info.st_size > limit:
            raise ModelSourceError(f"{shown!r} is {info.st_size:,} bytes, more than the "
                                   f"{limit:,} such a file may have; is it the right file?")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as e:
        raise ModelSourceError(f"cannot read {shown!r}: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ModelSourceError(f"{shown!r} is larger than the {limit:,} bytes such a file "
                               f"may have")
    return data


def check_inside(path: Path, root: Path, shown: str = "") -> Path:
    """``path`` resolved; it must lie inside ``root`` (links may not lead out of it).

    Raises:
        ModelSourceError: it resolves outside ``root``.
    """
    real = Path(os.path.realpath(path))
    if real != root and root not in real.parents:
        raise ModelSourceError(
            f"{shown or str(path)!r} resolves to {str(real)!r}, outside the checkpoint folder "
            f"{str(root)!r}; a checkpoint's files must lie inside its folder"
        )
    return real


def read_json_file(path: Path, root: Path, what: str = "",
                   limit: int = CONFIG_LIMIT) -> dict[str, Any]:
    """A small JSON object of a checkpoint (config.json, a shard index), size-capped.

    Raises:
        ModelSourceError: as ``read_checkpoint_file``, or it is not a JSON object.
    """
    shown = what or str(path)
    data = read_checkpoint_file(path, root, limit=limit, what=shown)
    try:
        values = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelSourceError(f"cannot read {shown!r} as JSON: {_first_line(e)}") from e
    if not isinstance(values, dict):
        raise ModelSourceError(f"{shown!r} holds no JSON object")
    return values


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint folder, read safely (not yet checked).

    Raises:
        ModelSourceError: no config.json, or it cannot be read as a JSON object.
    """
    path = Path(folder) / "config.json"
    if not os.path.lexists(path):
        raise ModelSourceError(
            f"no config.json at {str(path)!r}; a HuggingFace checkpoint folder needs one"
        )
    return read_json_file(path, checkpoint_root(folder))


def check_tokenizer_files(folder: str | os.PathLike[str]) -> None:
    """The tokenizer files a folder holds are regular, inside it, capped, and vocab.txt is text.

    Raises:
        ModelSourceError: a file that is not, naming it and what is wrong.
    """
    root = checkpoint_root(folder)
    special = dict(_SPECIAL_TOKENS)
    for name in TOKENIZER_FILES[1:]:  # the JSON files first: they may rename special tokens
        path = Path(folder) / name
        if not os.path.lexists(path):
            continue
        limit = TOKENIZER_LIMIT if name == "tokenizer.json" else CONFIG_LIMIT
        values = read_json_file(path, root, str(path), limit)
        if name == "tokenizer_config.json":
            for key in special:
                token = values.get(key)
                token = token.get("content") if isinstance(token, dict) else token
                if isinstance(token, str):
                    special[key] = token
    vocab = Path(folder) / "vocab.txt"
    if os.path.lexists(vocab):
        data = read_checkpoint_file(vocab, root, limit=TOKENIZER_LIMIT)
        _check_vocab(data, str(vocab), special.values())


_SPECIAL_TOKENS = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                   "pad_token": "[PAD]"}


def _check_vocab(data: bytes, shown: str, special: Iterable[str]) -> None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelSourceError(f"{shown!r} is not UTF-8 text ({e.reason} at byte {e.start}); "
                               f"a WordPiece vocab has one token per line") from e
    if "\x00" in text:
        raise ModelSourceError(f"{shown!r} holds NUL bytes; a WordPiece vocab is text, one "
                               f"token per line")
    tokens = {line.strip() for line in text.splitlines()} - {""}
    if not tokens:
        raise ModelSourceError(f"{shown!r} is empty; a WordPiece vocab has one token per line")
    absent = [t for t in special if t not in tokens]
    if absent:
        raise ModelSourceError(f"{shown!r} lacks the special tokens {', '.join(absent)} that "
                               f"BERT's tokenizer needs")


# ----------------------------------------------------------------------------------------
# config.json values


def check_config(values: Mapping[str, Any], *, activations: Collection[str],
                 source: str = "config.json") -> None:
    """The values of a BERT ``config.json`` are of the right types and ranges.

    Args:
        values: the parsed config (HF's key names).
        activations: the ``hidden_act`` names the loader can build.
        source: the file, for messages.

    Raises:
        ModelSourceError: the first value that is wrong, quoted, and what it must be.
    """
    def fail(message: str) -> ModelSourceError:
        fix = "; fix config.json" if source.endswith("config.json") else ""
        return ModelSourceError(f"{source}: {message}{fix}")

    for key in _POSITIVE_INTS:
        if key in values and not _positive_int(values[key]):
            raise fail(f"{key} is {values[key]!r}; it must be a whole number > 0")
    hidden, heads = values.get("hidden_size", 768), values.get("num_attention_heads", 12)
    if hidden % heads:
        raise fail(f"the hidden size ({hidden}) is not a multiple of the number of attention "
                   f"heads ({heads})")
    act = values.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in activations:
        raise fail(f"hidden_act {act!r} is not supported; use one of "
                   f"{', '.join(sorted(activations))}")
    eps = values.get("layer_norm_eps", 1e-12)
    if not _number(eps) or not 0 < eps < 1:
        raise fail(f"layer_norm_eps is {eps!r}; it must be a number > 0 and < 1")
    for key in _PROBABILITIES:
        value = values.get(key)
        if value is not None and (not _number(value) or not 0 <= value < 1):
            raise fail(f"{key} is {value!r}; it must be a number >= 0 and < 1")
    init = values.get("initializer_range", 0.02)
    if not _number(init) or init < 0:
        raise fail(f"initializer_range is {init!r}; it must be a number >= 0")
    labels = values.get("num_labels")
    if labels is not None and not (_positive_int(labels) and labels <= MAX_LABELS):
        raise fail(f"num_labels is {labels!r}; it must be a whole number from 1 to "
                   f"{MAX_LABELS:,}")
    id2label = values.get("id2label")
    if id2label is not None and (not isinstance(id2label, dict) or len(id2label) > MAX_LABELS):
        raise fail(f"id2label must be an object of at most {MAX_LABELS:,} labels")
    pad = values.get("pad_token_id")
    vocab = values.get("vocab_size", 30522)
    if pad is not None and not (isinstance(pad, int) and not isinstance(pad, bool)
                                and 0 <= pad < vocab):
        raise fail(f"pad_token_id is {pad!r}; it must be a token id from 0 to {vocab - 1}")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def num_labels(values: Mapping[str, Any]) -> int:
    """``num_labels``, or the size of ``id2label`` as HF reads it, else 2."""
    if values.get("num_labels") is not None:
        return int(values["num_labels"])
    return len(values["id2label"]) if values.get("id2label") else 2


# ----------------------------------------------------------------------------------------
# Size against memory


def estimate_parameters(values: Mapping[str, Any]) -> int:
    """Parameters of the largest BERT (any head) a checked config describes.

    Embeddings, every layer (attention, feed-forward, two LayerNorms), the pooler, and the
    largest head (the MLM transform and decoder bias plus a classifier). A Llama is counted
    as one (``_llama_parameters``): three feed-forward matrices, grouped keys and values.
    """
    if values.get("model_type") == "llama":
        return _llama_parameters(values)
    v, h = values.get("vocab_size", 30522), values.get("hidden_size", 768)
    p, t = values.get("max_position_embeddings", 512), values.get("type_vocab_size", 2)
    layers, inner = values.get("num_hidden_layers", 12), values.get("intermediate_size", 3072)
    labels = num_labels(values)
    embeddings = (v + p + t) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h * inner + inner + h + 4 * h
    heads = (h * h + h) + (h * h + 3 * h + v) + (h * labels + labels)  # pooler, MLM, classifier
    return int(embeddings + layers * layer + heads)


def _llama_parameters(values: Mapping[str, Any]) -> int:
    """A Llama's parameters: embeddings, the head (unless tied), every layer, the norms."""
    v, h = values.get("vocab_size", 32000), values.get("hidden_size", 4096)
    layers, inner = values.get("num_hidden_layers", 32), values.get("intermediate_size", 11008)
    heads = values.get("num_attention_heads", 32)
    kv = (values.get("num_key_value_heads") or heads) * (h // max(heads, 1))
    layer = 2 * h * h + 2 * h * kv + 3 * h * inner + 2 * h  # q, o; k, v; gate, up, down; norms
    head = 0 if values.get("tie_word_embeddings", False) else v * h
    return int(v * h + head + layers * layer + h)


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable on Linux, else physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 2**40  # unknown: do not refuse on memory


def check_model_size(values: Mapping[str, Any], *, source: str = "config.json",
                     memory: int | None = None, mapped: bool = False) -> int:
    """Refuse a config whose model would not fit in memory; return its parameter estimate.

    The estimate is in float32, against ``MEMORY_SHARE`` of the memory available. ``mapped``:
    the weights are safetensors, which transformers reads in place (memory-mapped) when
    they are stored in the dtype it loads: the model needs its bytes once. Their headers
    give the exact bytes next (``check_weights_memory``), so this first check only refuses
    what cannot fit however it loads: the estimate in the config's dtype (float16 where it
    names none) against ``MAPPED_SHARE``.

    Raises:
        ModelSourceError: the estimate is over the share of the memory available, with the
            estimate and the limit in the message.
    """
    parameters = estimate_parameters(values)
    memory = available_memory() if memory is None else memory
    dtype = config_dtype(values) if mapped else None
    if mapped:
        share, dtype = MAPPED_SHARE, dtype or "float16"
    else:
        share, dtype = MEMORY_SHARE, "float32"
    needed, limit = parameters * _DTYPE_BYTES[dtype], int(memory * share)
    if needed > limit:
        raise ModelSourceError(
            f"{source} describes a model of about {_count(parameters)} parameters "
            f"({_bytes(needed)} in {dtype}), more than the {_bytes(limit)} this machine can "
            f"give it ({share:.0%} of {_bytes(memory)} available); check its sizes"
        )
    return parameters


# torch dtype names a config.json may give -> bytes per value
_DTYPE_BYTES = {"float32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "half": 2,
                "bfloat16": 2}
# safetensors dtype names of floats -> torch's
_SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def config_dtype(values: Mapping[str, Any]) -> str | None:
    """The dtype a config says its weights are in (``dtype``, or the older ``torch_dtype``)."""
    named = values.get("dtype", values.get("torch_dtype"))
    named = str(named).removeprefix("torch.") if named is not None else None
    return named if named in _DTYPE_BYTES else None


def check_weights_memory(tensors: Mapping[str, tuple[str, tuple[int, ...]]],
                         values: Mapping[str, Any], *, mapped: bool,
                         source: str = "the weights", memory: int | None = None) -> int:
    """Refuse weights that would not fit in memory as they load; return the bytes they take.

    ``tensors``: key -> (safetensors dtype, shape), from the headers. transformers loads the
    floats in the config's dtype (else as stored). Safetensors stored in that dtype are
    memory-mapped (``mapped``), never copied: the model needs their bytes once, and may take
    ``MAPPED_SHARE`` of the memory available (page cache holding them counts as available).
    A cast on loading, or a ``.bin``, holds the weights in memory of their own:
    ``MEMORY_SHARE``, as for any model.

    Raises:
        ModelSourceError: the bytes are over that share, with both in the message.
    """
    wanted = config_dtype(values)
    loaded, cast = 0, False
    for dtype, shape in tensors.values():
        stored = _SAFETENSORS_FLOATS.get(dtype)
        target = wanted if stored is not None and wanted is not None else stored
        cast |= target != stored
        loaded += math.prod(shape) * (_DTYPE_BYTES[target] if target else
                                      _SAFETENSORS_DTYPES.get(dtype, 4))
    in_place = mapped and not cast
    share = MAPPED_SHARE if in_place else MEMORY_SHARE
    memory = available_memory() if memory is None else memory
    limit = int(memory * share)
    if loaded > limit:
        how = ("read in place (memory-mapped)" if in_place else
               f"cast to {wanted} as they load" if cast else "loaded into memory")
        raise ModelSourceError(
            f"{source} take {_bytes(loaded)} {how}, more than the {_bytes(limit)} this machine "
            f"can give them ({share:.0%} of {_bytes(memory)} available); free memory, or use "
            f"a smaller model"
        )
    return loaded


def _count(n: int) -> str:
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def _bytes(n: int) -> str:
    for size, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB")):
        if n >= size:
            return f"{n / size:.1f} {suffix}"
    return f"{n:,} bytes"


# ----------------------------------------------------------------------------------------
# Weights files, without reading the tensors


def safetensors_shapes(path: Path, root: Path) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a safetensors file, from its header; every offset checked.

    Raises:
        ModelSourceError: the file is empty, truncated, not safetensors, or outside ``root``.
    """
    return {key: shape for key, (_, shape) in safetensors_tensors(path, root).items()}


def safetensors_tensors(path: Path, root: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Key -> (dtype, shape) of a safetensors file, from its header; every offset checked.

    Raises:
        ModelSourceError: as ``safetensors_shapes``.
    """
    shown = str(path)
    bad = f"cannot read weights from {shown!r}:"
    real = check_inside(path, root, shown)
    try:
        with open(real, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ModelSourceError(f"{bad} it is not a regular file")
            size = info.st_size
            if size == 0:
                raise ModelSourceError(f"{bad} the file is empty; copy the checkpoint again")
            prefix = handle.read(8)
            header_size = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < header_size <= min(size - 8, SAFETENSORS_HEADER_LIMIT):
                raise ModelSourceError(
                    f"{bad} not a safetensors file, or truncated (no header fits in its "
                    f"{size:,} bytes); copy the checkpoint again"
                )
            raw = handle.read(header_size)
    except OSError as e:
        raise ModelSourceError(f"{bad} {e.strerror or e}") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelSourceError(f"{bad} not safetensors: its header is not JSON "
                               f"({_first_line(e)})") from e
    if not isinstance(header, dict):
        raise ModelSourceError(f"{bad} not a safetensors file: its header is no object")
    data_size, end = size - 8 - header_size, 0
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        shape = _tensor_entry(entry)
        if shape is None:
            raise ModelSourceError(f"{bad} not a valid safetensors file: the entry of "
                                   f"{key!r} is malformed")
        dtype, dims, (start, stop) = shape
        if stop - start != math.prod(dims) * _SAFETENSORS_DTYPES[dtype]:
            raise ModelSourceError(f"{bad} not a valid safetensors file: {key!r} has "
                                   f"{stop - start} bytes for shape {tuple(dims)} {dtype}")
        shapes[key], end = (dtype, tuple(dims)), max(end, stop)
    if end > data_size:
        raise ModelSourceError(f"{bad} the file is truncated: its tensors need {end:,} "
                               f"bytes, it holds {data_size:,}; copy the checkpoint again")
    return shapes


def _tensor_entry(entry: object) -> tuple[str, list[int], tuple[int, int]] | None:
    if not isinstance(entry, dict):
        return None
    dtype, dims, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _SAFETENSORS_DTYPES or not isinstance(dims, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
    ):
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return None
    return dtype, dims, (offsets[0], offsets[1])


def torch_bin_state(path: Path, root: Path) -> dict[str, Any]:
    """The tensors of a ``pytorch_model.bin``, memory-mapped, unpickled with ``weights_only``.

    ``weights_only=True`` lets the unpickler build tensors and plain containers only; a
    file that asks for anything else (a class, a function: code) is refused, never run.

    Raises:
        ModelSourceError: the file holds Python objects other than tensors, or is not a
            PyTorch checkpoint, or resolves outside ``root``.
    """
    import pickle

    import torch

    shown = str(path)
    real = check_inside(path, root, shown)
    if not real.is_file():
        raise ModelSourceError(f"cannot read weights from {shown!r}: not a regular file")
    if real.stat().st_size == 0:
        raise ModelSourceError(f"cannot read weights from {shown!r}: the file is empty; "
                               f"copy the checkpoint again")
    try:
        with warnings.catch_warnings():  # e.g. "pickle protocol 4": the error says enough
            warnings.simplefilter("ignore")
            try:
                state = torch.load(real, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                state = torch.load(real, map_location="cpu", weights_only=True)  # old format
    except pickle.UnpicklingError as e:
        wanted = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        holds = f"it asks for {wanted.group(1)}" if wanted else "it holds Python objects"
        raise ModelSourceError(
            f"cannot read weights from {shown!r}: refused to unpickle it ({holds}: code could "
            f"run); convert it to safetensors with a tool you trust"
        ) from e
    except Exception as e:  # a zip, pickle or torch error: the file is not a checkpoint
        raise ModelSourceError(f"cannot read weights from {shown!r}: {_first_line(e)}") from e
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelSourceError(f"{shown!r} holds no state dict of tensors")
    return dict(state)


def shard_files(index: Path, root: Path) -> list[Path]:
    """The shard files a ``*.index.json`` lists, each checked to lie inside ``root``.

    Raises:
        ModelSourceError: an index that cannot be read, or a shard name that is absolute,
            climbs out (``..``) or resolves outside the checkpoint folder.
    """
    shown = str(index)
    weight_map = read_json_file(index, root, shown).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ModelSourceError(f"{shown!r} has no weight_map of key -> shard file")
    shards = []
    for name in sorted(set(weight_map.values())):
        if os.path.isabs(name) or ".." in Path(name).parts or not name:
            raise ModelSourceError(f"{shown!r} names the shard {name!r}, outside the "
                                   f"checkpoint folder; shards must lie inside it")
        shard = index.parent / name
        check_inside(shard, root, str(shard))
        shards.append(shard)
    return shards


# ----------------------------------------------------------------------------------------
# Weights against the config


def check_weights_fit(values: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                      source: str) -> None:
    """The weights hold the layers and embedding sizes the config asks for.

    Checked before a model is built, so a config of 100000 layers over a 6-layer
    checkpoint is refused without allocating them. Layers the config does not ask for
    are left to the loaders' key checks, which name every such key.

    Raises:
        ModelSourceError: fewer layers than config.json's ``num_hidden_layers``, or word /
            position / token-type embeddings of other sizes, naming the keys.
    """
    present = sorted({int(m.group(1)) for key in shapes if (m := _LAYER_KEY.search(key))})
    expected = values.get("num_hidden_layers", 12)
    if present and len(present) < expected:  # extra layers are named by the key checks
        missing = sorted(set(range(expected)) - set(present))
        raise ModelSourceError(
            f"config.json sets num_hidden_layers {expected}, but {source} holds "
            f"{len(present)} (encoder.layer.{_span(present)}): encoder.layer.{_span(missing)} "
            f"would be random; make the two match"
        )
    # ALBERT and ELECTRA embed in a smaller size and project up to hidden_size
    hidden = values.get("embedding_size", values.get("hidden_size", 768))
    for suffix, rows_key in (("word_embeddings.weight", "vocab_size"),
                             ("position_embeddings.weight", "max_position_embeddings"),
                             ("token_type_embeddings.weight", "type_vocab_size")):
        key = next((k for k in shapes if k.endswith("embeddings." + suffix)), None)
        if key is None:
            continue
        wanted = (values.get(rows_key, _DEFAULTS[rows_key]), hidden)
        if tuple(shapes[key]) != wanted:
            raise ModelSourceError(
                f"{source} has {key} of shape {tuple(shapes[key])}, but config.json's "
                f"{rows_key} and hidden_size give {wanted}; make config.json and the weights "
                f"match"
            )


_DEFAULTS = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}


def _span(indices: Iterable[int]) -> str:
    items = list(indices)
    if not items:
        return "none"
    if items == list(range(items[0], items[-1] + 1)) and len(items) > 2:
        return f"{items[0]}-{items[-1]}"
    return ", ".join(map(str, items[:8])) + (" ..." if len(items) > 8 else "")


# ----------------------------------------------------------------------------------------
# Texts


def check_texts(texts: Iterable[object], *, head: str = "base") -> tuple[str, ...]:
    """Texts the tokenizer can take: at least one, each a non-blank string of valid Unicode.

    Raises:
        InputError: no text, a text that is not a string, blank, holds text that is not
            valid UTF-8 (lone surrogates, as undecodable command-line bytes become), or an
            odd number of texts for the next-sentence head.
    """
    if isinstance(texts, str):
        texts = (texts,)
    items = tuple(texts)
    if not items:
        raise InputError("no text given; pass at least one --text")
    for i, text in enumerate(items, 1):
        if not isinstance(text, str):
            raise InputError(f"text {i} is a {type(text).__name__}, not a string")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"text {i} is not valid UTF-8 (at character {e.start}); pass "
                             f"text in UTF-8") from e
        if not text.strip():
            raise InputError(f"text {i} is empty; give every --text some words")
    if head == "next-sentence" and len(items) % 2:
        raise InputError(f"the next-sentence head takes texts in pairs; got {len(items)} texts")
    return items  # type: ignore[return-value]


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 300 else text[:299] + "…"
