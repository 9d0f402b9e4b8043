"""What the from-scratch BERT returns: a dict with HuggingFace's field names.

An output is a real ``dict`` (so ``torch.fx``, ``json`` and ``**`` take it as it is) that
also answers attributes and integer indices the way HF's ``ModelOutput`` does::

    >>> out = model(input_ids=ids, labels=labels)
    >>> out.loss is out["loss"] is out[0]
    True
    >>> list(out)
    ['loss', 'logits']

Fields that are ``None`` are left out of the mapping; asking for one of them by attribute
answers ``None``, as HF does (``out.loss`` without labels).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch


class ModelOutput(dict[str, Any]):
    """A dict of output tensors in a fixed field order; ``None`` fields are left out."""

    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self.fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        super().__init__(
            (name, values[name]) for name in self.fields if values.get(name) is not None
        )

    def __getattr__(self, name: str) -> Any:
        if name in self:
            return self[name]
        if name in self.fields:
            return None
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __getitem__(self, key: str | int | slice) -> Any:  # type: ignore[override]
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple[Any, ...]:
        """The present fields' values, in field order (HF's ``return_dict=False``)."""
        return tuple(self.values())

    def __repr__(self) -> str:
        parts = [f"{name}={_describe(value)}" for name, value in self.items()]
        return f"{type(self).__name__}({', '.join(parts)})"


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}" if value.dim() else f"Tensor({value.item():.6g})"
    if isinstance(value, tuple):
        return f"({len(value)} tensors)"
    return repr(value)


class BaseModelOutputWithPooling(ModelOutput):
    """``BertModel``: per-token vectors and the pooled [CLS] vector."""

    fields = ("last_hidden_state", "pooler_output", "hidden_states")


class BertForPreTrainingOutput(ModelOutput):
    """``BertForPreTraining``: masked-LM and next-sentence logits, their summed loss."""

    fields = ("loss", "prediction_logits", "seq_relationship_logits", "hidden_states")


class MaskedLMOutput(ModelOutput):
    """``BertForMaskedLM``: vocabulary logits per token."""

    fields = ("loss", "logits", "hidden_states")


class NextSentencePredictorOutput(ModelOutput):
    """``BertForNextSentencePrediction``: is-next / is-random logits."""

    fields = ("loss", "logits", "hidden_states")


class SequenceClassifierOutput(ModelOutput):
    """``BertForSequenceClassification``: one row of label logits per sequence."""

    fields = ("loss", "logits", "hidden_states")


class MultipleChoiceModelOutput(ModelOutput):
    """``BertForMultipleChoice``: one logit per choice."""

    fields = ("loss", "logits", "hidden_states")


class TokenClassifierOutput(ModelOutput):
    """``BertForTokenClassification``: label logits per token."""

    fields = ("loss", "logits", "hidden_states")


class QuestionAnsweringModelOutput(ModelOutput):
    """``BertForQuestionAnswering``: answer-span start and end logits per token."""

    fields = ("loss", "start_logits", "end_logits", "hidden_states")
