"""Read HuggingFace BERT checkpoints into the from-scratch model, key by key.

The model's parameter names are HF's checkpoint keys, so loading needs no mapping table:
only the ``bert.`` prefix (present in head checkpoints, absent in base-model ones) and
old ``LayerNorm.gamma``/``beta`` names are normalised. Every key of the checkpoint is
accounted for, once, in a ``LoadingReport``:

- loaded: it filled a parameter of the same shape;
- tied: it names a weight that is shared with one already loaded (the MLM decoder);
- ignored buffer: a buffer the model rebuilds (``embeddings.position_ids``);
- unused: it belongs to a head or pooler the model does not have (warned; an error
  with ``strict=True``).

Anything else is an error: an unknown key, a shape that does not fit, two keys for one
parameter, or a backbone parameter the checkpoint lacks. Head parameters the checkpoint
lacks keep their fresh init from a fixed seed (warned; an error with ``strict=True``).
Imports nothing from transformers.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from introspect.errors import ModelSourceError
from introspect.models import validate
from introspect.scratch.config import BertConfig

# Weights a checkpoint lacks (a fresh classifier, say) are drawn from this seed, so two
# loads of the same checkpoint give the same model.
INIT_SEED = 0

# Weights files of a HF checkpoint folder, in the order they are looked for.
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

# Parameters that belong to a head (or the optional pooler): they may be missing from a
# checkpoint or unused by a model. Backbone parameters (embeddings, encoder) may not.
_HEAD_KEY = re.compile(r"^(bert\.)?pooler\.|^cls\.|^classifier\.|^qa_outputs\.")
_BACKBONE_ROOTS = ("embeddings", "encoder", "pooler")
# Buffers old checkpoints saved and the model rebuilds from its config.
_REBUILT_BUFFER = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
_SHOWN = 5  # keys named in one message before "and N more"


class LoadingWarning(UserWarning):
    """Head weights were freshly initialised, or checkpoint weights were left unused."""


@dataclass(frozen=True)
class LoadingReport:
    """Where every checkpoint key went, and which model parameters it did not fill."""

    source: str  # the weights file, or the in-memory module, the keys came from
    loaded: tuple[str, ...]  # model parameters filled from the checkpoint
    initialized: tuple[str, ...]  # model parameters the checkpoint lacks, drawn from INIT_SEED
    unused: tuple[str, ...]  # checkpoint keys of parts the model lacks (another head, pooler)
    renamed: tuple[tuple[str, str], ...]  # (checkpoint key, model parameter) where names differ
    tied: tuple[str, ...]  # checkpoint keys naming a shared weight loaded under another name
    ignored_buffers: tuple[str, ...]  # checkpoint buffers the model rebuilds itself

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} parameters from {self.source}"]
        for label, keys in (
            (f"initialised from seed {INIT_SEED}", self.initialized),
            ("unused", self.unused),
            ("tied", self.tied),
            ("ignored buffers", self.ignored_buffers),
        ):
            if keys:
                lines.append(f"{label}: {_names(keys)}")
        return "\n".join(lines)


def _names(keys: tuple[str, ...] | list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown if len(keys) <= _SHOWN else f"{shown} and {len(keys) - _SHOWN} more"


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


# ----------------------------------------------------------------------------------------
# Reading a checkpoint folder


def read_checkpoint(
    folder: str | os.PathLike[str],
) -> tuple[BertConfig, dict[str, torch.Tensor], str]:
    """Read config.json and the weights of a HuggingFace checkpoint folder.

    Everything cheap is checked before a tensor is read: config.json (size-capped, inside
    the folder, its values), the weights' headers (safetensors) and layers against the
    config, and the model's size against this machine's memory.

    Args:
        folder: a folder holding ``config.json`` and ``model.safetensors`` (or a sharded
            safetensors index, or ``pytorch_model.bin``), or a hub id (``owner/name``)
            already in the local Hugging Face cache (never downloaded).

    Returns:
        The config, the state dict as stored, and the weights file's path (for messages).

    Raises:
        ModelSourceError: no such folder, no config or weights, a file that cannot be read
            or lies outside the folder, a config that is not a BERT's or does not match
            the weights, or a model too large for this machine.
    """
    path = Path(folder)
    if not path.exists():
        path = validate.cached_snapshot(str(folder)) or path  # a hub id in the local cache
    if not path.exists():
        raise ModelSourceError(f"checkpoint folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise ModelSourceError(
            f"{str(path)!r} is a file; pass the folder that holds config.json and the weights"
        )
    config = BertConfig.from_json_file(path / "config.json")
    values = config.to_dict()
    for name in SAFETENSORS_FILES + TORCH_FILES:
        if os.path.lexists(path / name):
            weights = path / name
            break
    else:
        raise ModelSourceError(
            f"no weights in {str(path)!r}: looked for {', '.join(SAFETENSORS_FILES + TORCH_FILES)}"
        )
    root = validate.checkpoint_root(path)
    validate.check_model_size(values, source=str(path / "config.json"))
    files = validate.shard_files(weights, root) if weights.name.endswith(".index.json") else [
        weights]
    if weights.name.startswith("model.safetensors"):
        shapes: dict[str, tuple[int, ...]] = {}
        for file in files:
            shapes.update(validate.safetensors_shapes(file, root))
        validate.check_weights_fit(values, shapes, str(weights))
        state = _read_safetensors(files, weights)
    else:
        state = {}
        for file in files:
            state.update(validate.torch_bin_state(file, root))  # memory-mapped
        validate.check_weights_fit(values, {k: tuple(v.shape) for k, v in state.items()},
                                   str(weights))
    return config, state, str(weights)


def _read_safetensors(files: list[Path], weights: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file), device="cpu"))
        except Exception as e:  # the headers were checked; this is a read error
            raise ModelSourceError(f"cannot read weights from {str(file)!r}: {e}") from e
    if weights.name.endswith(".index.json"):
        listed = validate.read_json_file(weights, validate.checkpoint_root(weights.parent))
        absent = sorted(set(listed["weight_map"]) - set(state))
        if absent:
            raise ModelSourceError(
                f"the shards of {str(weights)!r} lack keys their index lists: {_names(absent)}"
            )
    return state


def check_fits(config: BertConfig, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Before a model is built: its size fits in memory and the weights hold its layers.

    Raises:
        ModelSourceError: as ``validate.check_model_size`` and ``check_weights_fit``.
    """
    values = config.to_dict()
    validate.check_model_size(values, source=source)
    validate.check_weights_fit(values, {k: tuple(v.shape) for k, v in state.items()}, source)


def read_hf_module(hf_model: nn.Module) -> tuple[BertConfig, dict[str, torch.Tensor]]:
    """The config and state dict of a HuggingFace BERT module held in memory.

    Raises:
        ModelSourceError: the object is not a HF model (no ``config.to_dict()``) or its
            config is not a BERT this model can be.
    """
    hf_config: Any = getattr(hf_model, "config", None)
    if not isinstance(hf_model, nn.Module) or not callable(getattr(hf_config, "to_dict", None)):
        raise ModelSourceError(
            f"from_hf takes a transformers BERT model (an nn.Module with .config), "
            f"got {type(hf_model).__name__}"
        )
    values = dict(hf_config.to_dict())
    values["_attn_implementation"] = getattr(hf_config, "_attn_implementation", None)
    state = {key: value.detach() for key, value in hf_model.state_dict().items()}
    return BertConfig.from_dict(values), state


# ----------------------------------------------------------------------------------------
# Matching keys to parameters


def _model_key(checkpoint_key: str, prefix: str) -> str:
    """The parameter a checkpoint key names: gamma/beta renamed, ``bert.`` added or dropped."""
    key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", checkpoint_key))
    if prefix and key.split(".", 1)[0] in _BACKBONE_ROOTS:
        return prefix + key
    if not prefix and key.startswith("bert."):
        return key[len("bert.") :]
    return key


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Second names of shared parameters (``cls.predictions.decoder.weight``) -> first name."""
    first_name: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first_name:
            aliases[name] = first_name[id(param)]
        else:
            first_name[id(param)] = name
    return aliases


def load_state(
    model: nn.Module, state: Mapping[str, torch.Tensor], source: str, *, strict: bool = False
) -> LoadingReport:
    """Copy a HuggingFace BERT state dict into ``model``, accounting for every key.

    Args:
        model: a from-scratch ``BertModel`` or head (a head has its backbone at ``bert``).
        state: the checkpoint's tensors by key, with or without the ``bert.`` prefix.
        source: where the state came from, for messages.
        strict: raise instead of warning when head parameters are missing or unused.

    Returns:
        The ``LoadingReport``.

    Raises:
        ModelSourceError: a key that fits no parameter, a shape mismatch (both shapes
            named), two keys for one parameter, a missing backbone parameter, or with
            ``strict`` a missing or unused head parameter. Nothing is copied then.
    """
    params = dict(model.named_parameters())
    aliases = tied_aliases(model)
    prefix = "bert." if isinstance(getattr(model, "bert", None), nn.Module) else ""
    owner = type(model).__name__
    filled: dict[str, str] = {}  # model parameter -> checkpoint key
    unused, tied, ignored, unexpected = [], [], [], []
    for checkpoint_key, tensor in state.items():
        key = _model_key(checkpoint_key, prefix)
        if _REBUILT_BUFFER.search(key):
            ignored.append(checkpoint_key)
        elif key in params or key in aliases:
            target = params[aliases.get(key, key)]
            if _shape(tensor) != _shape(target):
                raise ModelSourceError(
                    f"checkpoint key {checkpoint_key!r} has shape {_shape(tensor)} in {source}, "
                    f"but {owner}.{key} has shape {_shape(target)}; check config.json (and "
                    f"num_labels, for a classifier)"
                )
            if key in aliases:
                tied.append(checkpoint_key)
            elif key in filled:
                raise ModelSourceError(
                    f"checkpoint keys {filled[key]!r} and {checkpoint_key!r} in {source} both "
                    f"load into {owner}.{key}; remove one of them"
                )
            else:
                filled[key] = checkpoint_key
        elif _HEAD_KEY.match(key):
            unused.append(checkpoint_key)
        else:
            unexpected.append(checkpoint_key)
    if unexpected:
        raise ModelSourceError(
            f"checkpoint keys fit no parameter of {owner}: {_names(unexpected)} (in {source}); "
            f"is it a BERT checkpoint whose config.json matches its weights?"
        )
    missing = [key for key in params if key not in filled]
    backbone_missing = [key for key in missing if not _HEAD_KEY.match(key)]
    if backbone_missing:
        shown = [f"{key} {_shape(params[key])}" for key in backbone_missing]
        raise ModelSourceError(
            f"{source} lacks {len(backbone_missing)} parameters of {owner}: {_names(shown)}; "
            f"is the checkpoint complete, and does config.json match it?"
        )
    if strict and (missing or unused):
        raise ModelSourceError(
            f"strict loading of {owner} from {source}: "
            + "; ".join(
                part
                for part in (
                    f"missing head parameters {_names(missing)}" if missing else "",
                    f"unused checkpoint keys {_names(unused)}" if unused else "",
                )
                if part
            )
            + f"; pass strict=False to draw missing ones from seed {INIT_SEED} and skip unused ones"
        )
    with torch.no_grad():
        for key, checkpoint_key in filled.items():
            params[key].copy_(state[checkpoint_key])
    _warn(owner, source, missing, unused)
    return LoadingReport(
        source=source,
        loaded=tuple(filled),
        initialized=tuple(missing),
        unused=tuple(unused),
        renamed=tuple((c, k) for k, c in filled.items() if c != k),
        tied=tuple(tied),
        ignored_buffers=tuple(ignored),
    )


def _warn(owner: str, source: str, missing: list[str], unused: list[str]) -> None:
    if missing:
        warnings.warn(
            f"{owner}: {len(missing)} parameters are not in {source} and were drawn from seed "
            f"{INIT_SEED}: {_names(missing)}; train them before trusting the outputs",
            LoadingWarning,
            stacklevel=5,
        )
    if unused:
        warnings.warn(
            f"{owner}: {len(unused)} weights of {source} belong to parts {owner} does not "
            f"have and were not used: {_names(unused)}",
            LoadingWarning,
            stacklevel=5,
        )


# ----------------------------------------------------------------------------------------
# Writing a checkpoint folder


def save_checkpoint(model: nn.Module, folder: str | os.PathLike[str]) -> None:
    """Write ``config.json`` and ``model.safetensors`` as HF's ``save_pretrained`` does.

    Shared (tied) weights are written once, under their first name, as HF writes them.
    Each file is written through ``introspect.files`` (atomically: temp file, rename), so
    no half-written file stays.

    Raises:
        InputError: the folder cannot be created or a file cannot be written (one line).
    """
    from safetensors.torch import save

    from introspect.files import describe_os_error, write_file

    config: BertConfig = model.config  # type: ignore[assignment]
    values = config.to_dict()
    values["architectures"] = [type(model).__name__]
    tensors = {name: p.detach().contiguous().cpu() for name, p in model.named_parameters()}
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelSourceError(describe_os_error(e, path)) from e
    write_file(path / "config.json", json.dumps(values, indent=2) + "\n")
    write_file(path / "model.safetensors", save(tensors, metadata={"format": "pt"}))
