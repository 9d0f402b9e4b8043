"""The models and inputs every measurement uses: seeded, offline, the same on every run.

Models are introspect's random-init BERTs (``bert-tiny``, ``bert-base``, ``bert-large``),
optionally with fewer or more layers for the growth curves, each with its from-scratch
twin (``introspect.scratch``) holding the same weights. Inputs are seeded token ids at
every size, 2 x 9 included, padded a little more on every row so the attention mask
matters. (The tutorial's two sentences tokenize to 2 x 8 with the embedded vocabulary,
not 2 x 9, so no case of the grid uses them; ``make_inputs`` takes the tokenizer's output
only where it has exactly the size asked for, which keeps the tokens on drawings of a
2 x 8 case.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from introspect.models.load import DEFAULT_TEXTS, INIT_SEED, RANDOM_SIZES, load_model, tokenize

INPUT_SEED = 0
CLS, SEP, PAD = 101, 102, 0  # the uncased WordPiece vocab's special tokens
FIRST_WORD, VOCAB = 1000, 30522  # seeded ids are drawn from ordinary words
SENTENCES = (2, 8)  # the tutorial's two sentences, tokenized with the embedded vocabulary


@dataclass(frozen=True)
class ModelSpec:
    """A random-init BERT: one of introspect's sizes, with its layer count changed or not."""

    size: str  # a key of introspect.models.load.RANDOM_SIZES
    layers: int | None = None  # None: the size's own count

    @property
    def name(self) -> str:
        return self.size if self.layers is None else f"{self.size}/L{self.layers}"

    @property
    def layer_count(self) -> int:
        return self.layers if self.layers is not None else RANDOM_SIZES[self.size][1]


@dataclass
class Inputs:
    """One batch: the tensors by name, and the tokenizer's output when there is one."""

    tensors: dict[str, torch.Tensor]
    tokenized: Any = None  # introspect.models.load.TokenizedInputs at 2 x 8 (drawings show tokens)

    @property
    def for_introspect(self) -> Any:
        return self.tokenized if self.tokenized is not None else self.tensors

    @property
    def shape(self) -> tuple[int, int]:
        B, S = self.tensors["input_ids"].shape  # (B, S)
        return int(B), int(S)


def load_hf(spec: ModelSpec) -> tuple[torch.nn.Module, Any]:
    """The HF ``BertModel`` of ``spec`` in eval mode, and the embedded tokenizer.

    A model with its layer count changed is built directly (no tokenizer: its inputs are
    seeded ids), so that a fresh process never holds the full-size model first.
    """
    if spec.layers is None:
        loaded = load_model(spec.size)
        return loaded.model, loaded.tokenizer
    import transformers

    hidden, _, heads, intermediate = RANDOM_SIZES[spec.size]
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=spec.layers,
        num_attention_heads=heads, intermediate_size=intermediate,
        max_position_embeddings=512, attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):  # seeded like introspect's own random models
        torch.manual_seed(INIT_SEED)
        model = transformers.BertModel(config)
    return model.eval(), None


def scratch_twin(hf_model: torch.nn.Module) -> torch.nn.Module:
    """introspect's from-scratch model of the same class, with the HF model's weights."""
    import warnings

    import introspect.scratch

    scratch_class = getattr(introspect.scratch, type(hf_model).__name__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scratch_class.from_hf(hf_model).eval()


def make_inputs(batch: int, seq: int, tokenizer: Any = None) -> Inputs:
    """Inputs of shape (batch, seq): seeded ids, or the tutorial's sentences at their 2 x 8."""
    if tokenizer is not None and (batch, seq) == SENTENCES:
        tokenized = tokenize(tokenizer, DEFAULT_TEXTS)
        if tuple(tokenized.tensors["input_ids"].shape) == (2, 9):
            return Inputs(dict(tokenized.tensors), tokenized)
    generator = torch.Generator().manual_seed(INPUT_SEED)
    ids = torch.randint(FIRST_WORD, VOCAB, (batch, seq), generator=generator)  # (B, S)
    # Row 0 is full; each later row is padded a little more, down to half the length.
    lengths = torch.tensor([seq - (row * seq) // (2 * batch) for row in range(batch)])  # (B,)
    mask = torch.arange(seq)[None, :] < lengths[:, None]  # (B, S)
    ids[:, 0] = CLS
    ids[torch.arange(batch), lengths - 1] = SEP
    ids[~mask] = PAD
    return Inputs({
        "input_ids": ids,
        "token_type_ids": torch.zeros(batch, seq, dtype=torch.long),
        "attention_mask": mask.long(),
    })
