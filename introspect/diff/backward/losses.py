"""The loss both sides of a backward diff are differentiated through, one for both.

By default the reference's head says which loss (its class name, as HF names heads):
masked LM with seeded masked positions, sequence classification (and next sentence,
multiple choice) with seeded labels (a head of one label, a regression as HF's
``num_labels=1``, with a mean squared error against seeded targets), token
classification with seeded labels on real tokens, question answering with seeded start
and end positions, causal LM on the input shifted by one, and for a base model a seeded
random projection of the first output averaged over real tokens. Labels and masked
positions come from a fixed seed, so both sides, and every run, see the same ones.
Padding never counts: positions where ``attention_mask`` is 0 carry no label.

When the inputs hold ``labels`` the models compute their own loss: each side's returned
loss (``outputs["loss"]``, or its first scalar output) is differentiated. A user's
``loss(outputs, inputs) -> scalar`` replaces all of this, for both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from introspect.diff.backward.record import LossFn
from introspect.errors import InputError
from introspect.run.outputs import output_items

SEED = 1234  # labels, masked positions and projections
MLM_SHARE = 0.15  # of real tokens, at least one per row

KINDS = ("masked-lm", "causal-lm", "sequence-classification", "token-classification",
         "question-answering", "pretraining", "own-loss", "hidden")


def loss_kind(reference: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> str:
    """Which default loss fits the reference (its class name), or the models' own."""
    if "labels" in inputs:
        return "own-loss"
    name = type(reference).__name__
    for part, kind in (("PreTraining", "pretraining"), ("MaskedLM", "masked-lm"),
                       ("CausalLM", "causal-lm"), ("LMHead", "causal-lm"),
                       ("SequenceClassification", "sequence-classification"),
                       ("NextSentence", "sequence-classification"),
                       ("MultipleChoice", "sequence-classification"),
                       ("TokenClassification", "token-classification"),
                       ("QuestionAnswering", "question-answering")):
        if part in name:
            return kind
    return "hidden"


def default_loss(kind: str) -> LossFn:
    """The loss of ``kind`` (``KINDS``): a function of (outputs, inputs)."""
    if kind not in KINDS:
        raise InputError(f"unknown loss {kind!r}; known: {', '.join(KINDS)}")

    def loss(outputs: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if kind == "own-loss":
            return _own_loss(outputs)
        tensors = _output_tensors(outputs, _NAMED.get(kind, ()))
        if not tensors:
            raise InputError("the model returned no tensor to take a loss of")
        first = tensors[0]
        mask = inputs.get("attention_mask")
        if kind == "hidden":
            return _projection(first, mask)
        if kind == "masked-lm":
            return _token_ce(first, _mlm_labels(inputs, first.shape[:-1]))
        if kind == "pretraining":
            loss = _token_ce(first, _mlm_labels(inputs, first.shape[:-1]))
            if len(tensors) > 1 and tensors[1].ndim == 2:
                loss = loss + _class_ce(tensors[1])
            return loss
        if kind == "causal-lm":
            ids = inputs["input_ids"]
            labels = ids[:, 1:].clone()
            if mask is not None:
                labels[mask[:, 1:] == 0] = -100
            return _token_ce(first[:, :-1], labels)
        if kind == "sequence-classification":  # (one label: a regression head, as HF's
            # num_labels=1 is, trained on a mean squared error; a cross-entropy over one
            # class has no gradient, and such a port was refused: probe round m)
            return _regression(first) if first.shape[-1] == 1 else _class_ce(first)
        if kind == "token-classification":
            labels = _seeded(first.shape[:-1], first.shape[-1], 1)
            if mask is not None and mask.shape == labels.shape:
                labels[mask == 0] = -100
            return _token_ce(first, labels)
        # question answering: start and end logits, each (B, S)
        ends = tensors[:2] if len(tensors) > 1 else [first[..., 0], first[..., 1]]
        total = first.new_zeros(())
        for i, logits in enumerate(ends):
            positions = _seeded(logits.shape[:1], logits.shape[-1], 2 + i)
            if mask is not None:
                positions = torch.minimum(positions, mask.sum(dim=-1) - 1)
            total = total + F.cross_entropy(logits.float(), positions)
        return total / len(ends)

    loss.__name__ = f"{kind} loss"
    return loss


def _own_loss(outputs: Any) -> torch.Tensor:
    named = dict(output_items(outputs))
    if isinstance(named.get("loss"), torch.Tensor):
        return named["loss"]
    for t in named.values():
        if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point():
            return t
    raise InputError("the inputs hold labels, but the model returned no loss (no scalar "
                     "output); pass loss=... (--loss) to say how to take one")


# The outputs each loss reads, by HF's names, first where a model names them: a port that
# returns {"last_hidden_state", "logits"}, or its end logits before its start logits, is
# read as HF is (taken by position, a correct port FAILED: probe round m).
_NAMED = {"masked-lm": ("logits",), "causal-lm": ("logits",),
          "sequence-classification": ("logits",), "token-classification": ("logits",),
          "question-answering": ("start_logits", "end_logits"),
          "pretraining": ("prediction_logits", "seq_relationship_logits"),
          "hidden": ("last_hidden_state",)}


def _output_tensors(outputs: Any, named: tuple[str, ...] = ()) -> list[torch.Tensor]:
    """The floating outputs of more than one element, in order: a mapping's values, a
    dataclass's fields (a port's ``@dataclass`` output, as the forward diff reads it), a
    tuple's items; those ``named`` first, in that order."""
    items = [(name, value) for name, value in output_items(outputs)
             if isinstance(value, torch.Tensor) and value.is_floating_point()
             and value.numel() > 1]
    first = [value for wanted in named for name, value in items if name == wanted]
    return first + [value for name, value in items if name not in named]


def _seeded(shape: Any, classes: int, stream: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED + stream)
    return torch.randint(0, max(classes, 1), tuple(shape), generator=generator)


def _mlm_labels(inputs: Mapping[str, torch.Tensor], shape: Any) -> torch.Tensor:
    """The input ids at ~15% of real tokens (seeded, at least one per row), -100 elsewhere."""
    ids = inputs["input_ids"]
    generator = torch.Generator().manual_seed(SEED)
    chosen = torch.rand(ids.shape, generator=generator) < MLM_SHARE
    mask = inputs.get("attention_mask")
    real = mask.bool() if mask is not None and mask.shape == ids.shape else torch.ones_like(
        ids, dtype=torch.bool)
    chosen &= real
    rows = chosen.reshape(-1, ids.shape[-1])
    for r, row_real in zip(rows, real.reshape(-1, ids.shape[-1]), strict=True):
        if not r.any() and row_real.any():
            r[int(row_real.nonzero()[0])] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return labels.reshape(tuple(shape))


def _token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100)


def _class_ce(logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), _seeded(logits.shape[:1], logits.shape[-1], 0))


def _regression(scores: torch.Tensor) -> torch.Tensor:
    """The mean squared error against seeded targets drawn like the scores' own scale."""
    generator = torch.Generator().manual_seed(SEED + 5)
    targets = torch.randn(tuple(scores.shape), generator=generator).to(scores.device)
    return F.mse_loss(scores.float(), targets)


def _projection(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A seeded random projection of every real token's features, averaged."""
    generator = torch.Generator().manual_seed(SEED)
    weight = torch.randn(hidden.shape[-1], generator=generator, dtype=torch.float64)
    scores = (hidden.double() * weight.to(hidden.device)).sum(dim=-1)
    if mask is not None and mask.shape == scores.shape:
        keep = mask.to(scores.dtype)
        return ((scores * keep).sum() / keep.sum()).to(hidden.dtype)
    return scores.mean().to(hidden.dtype)


__all__ = ["KINDS", "default_loss", "loss_kind"]
