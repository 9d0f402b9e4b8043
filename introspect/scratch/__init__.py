"""BERT from scratch in plain PyTorch: every HF head, HF checkpoints, bit-exact with HF.

Imports nothing from transformers. ``model.py`` reads top to bottom from an activation
to the heads; ``config.py`` reads a HF ``config.json``; ``loading.py`` maps checkpoint
keys to parameters and reports what it did; ``outputs.py`` holds the returned dicts.

Example::

    >>> from introspect.scratch import BertForSequenceClassification
    >>> model = BertForSequenceClassification.from_pretrained(folder)   # eval mode
    >>> with torch.no_grad():
    ...     logits = model(input_ids=ids, attention_mask=mask).logits
"""

from __future__ import annotations

import os

from introspect.errors import ModelSourceError
from introspect.scratch.config import BertConfig
from introspect.scratch.loading import INIT_SEED, LoadingReport, LoadingWarning
from introspect.scratch.model import (
    MODELS,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertPreTrainedModel,
)
from introspect.scratch.outputs import ModelOutput


def auto_model_class(folder: str | os.PathLike[str]) -> type[BertPreTrainedModel]:
    """The class a checkpoint was saved from (config.json's ``architectures``), else ``BertModel``.

    Raises:
        ModelSourceError: config.json names an architecture with no from-scratch class.
    """
    from introspect.models.validate import read_config

    architectures = read_config(folder).get("architectures")  # size-capped, inside folder
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        architectures = None
    if not architectures:
        return BertModel
    if architectures[0] not in MODELS:
        raise ModelSourceError(
            f"config.json names architecture {architectures[0]!r}; the from-scratch BERT has "
            f"{', '.join(MODELS)}"
        )
    return MODELS[architectures[0]]


__all__ = [
    "INIT_SEED",
    "MODELS",
    "BertConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertPreTrainedModel",
    "LoadingReport",
    "LoadingWarning",
    "ModelOutput",
    "auto_model_class",
]
