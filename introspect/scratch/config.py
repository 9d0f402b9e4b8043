"""The configuration of the from-scratch BERT, read from a HuggingFace ``config.json``.

Field names are HuggingFace's, so a ``config.json`` written by ``transformers`` reads with
no mapping, and ``to_dict()`` writes one that ``transformers`` reads back. Imports nothing
from transformers.

Example::

    >>> config = BertConfig.from_json_file("model/config.json")
    >>> config.hidden_size, config.num_attention_heads, config.head_dim
    (384, 12, 32)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from introspect.errors import ModelSourceError
from introspect.models.validate import check_config, checkpoint_root, num_labels, read_json_file

# Activations the model can build, by HuggingFace's name (see model.activation).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


@dataclass(frozen=True)
class BertConfig:
    """Sizes and switches of a BERT model; the defaults are bert-base-uncased's."""

    vocab_size: int = 30522  # WordPiece vocabulary: rows of word_embeddings and of the MLM decoder
    hidden_size: int = 768  # H: width of every token vector between blocks
    num_hidden_layers: int = 12  # L: number of encoder blocks (BertLayer)
    num_attention_heads: int = 12  # nh: heads per self-attention; head width hd = H / nh
    intermediate_size: int = 3072  # width inside the feed-forward block (4H in the paper)
    hidden_act: str = "gelu"  # feed-forward and MLM-transform activation, by HF's name (erf GELU)
    hidden_dropout_prob: float = 0.1  # dropout after embeddings, attention output, feed-forward
    attention_probs_dropout_prob: float = 0.1  # dropout on the attention probabilities
    max_position_embeddings: int = 512  # longest sequence: rows of position_embeddings
    type_vocab_size: int = 2  # number of segments (token type ids): rows of token_type_embeddings
    initializer_range: float = 0.02  # std of the normal init of weights a checkpoint lacks
    layer_norm_eps: float = 1e-12  # epsilon of every LayerNorm
    pad_token_id: int | None = 0  # padding token; its word-embedding row starts at zero
    classifier_dropout: float | None = None  # dropout before classifiers; None: hidden_dropout_prob
    num_labels: int = 2  # outputs of the sequence / token classifier and of qa_outputs
    problem_type: str | None = None  # sequence-classification loss; None: chosen from labels
    tie_word_embeddings: bool = True  # the MLM decoder shares word_embeddings' weight and bias
    attn_implementation: str = "sdpa"  # "sdpa" (fused kernel) or "eager" (explicit matmuls)

    def __post_init__(self) -> None:
        # types, ranges, divisibility, activation: the checks config.json gets
        check_config(dataclasses.asdict(self), activations=ACTIVATIONS, source="BertConfig")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ModelSourceError(
                f"attn_implementation {self.attn_implementation!r} is not supported; "
                f"use 'sdpa' or 'eager'"
            )
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ModelSourceError(
                f"problem_type {self.problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}"
            )

    @property
    def head_dim(self) -> int:
        """hd: the width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "config.json") -> BertConfig:
        """Build a config from the keys of a HuggingFace BERT ``config.json``.

        Keys this model does not use (``architectures``, ``use_cache``, ...) are ignored;
        ``num_labels`` comes from ``num_labels`` or, as HF does, from ``id2label``.

        Args:
            values: the parsed ``config.json`` (or ``PretrainedConfig.to_dict()``).
            source: where the values come from, for messages.

        Returns:
            The config.

        Raises:
            ModelSourceError: the config describes something this BERT is not (another
                model type, a decoder, relative positions) or holds invalid values.
        """
        model_type = values.get("model_type", "bert")
        if model_type != "bert":
            raise ModelSourceError(
                f"config.json has model_type {model_type!r}; the from-scratch model is a BERT "
                f"('bert') and cannot load it"
            )
        for key, allowed in (
            ("is_decoder", False),
            ("add_cross_attention", False),
            ("position_embedding_type", "absolute"),
        ):
            if values.get(key, allowed) != allowed:
                raise ModelSourceError(
                    f"config.json sets {key}={values[key]!r}; the from-scratch BERT supports "
                    f"only {key}={allowed!r}"
                )
        check_config(values, activations=ACTIVATIONS, source=source)
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {key: value for key, value in values.items() if key in fields}
        kwargs["num_labels"] = num_labels(values)
        implementation = values.get("attn_implementation") or values.get("_attn_implementation")
        if implementation is not None:
            kwargs["attn_implementation"] = implementation
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ModelSourceError(f"config values do not fit BertConfig: {e}") from e

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> BertConfig:
        """Read a HuggingFace ``config.json``.

        The file is read with a size cap and must be a regular file inside its folder.

        Raises:
            ModelSourceError: the file is missing, too large, not a regular file, not JSON,
                or its values are not a BERT's.
        """
        file = Path(path)
        if not os.path.lexists(file):
            raise ModelSourceError(
                f"no config.json at {str(file)!r}; a HuggingFace checkpoint folder needs one"
            )
        values = read_json_file(file, checkpoint_root(file.parent))
        return cls.from_dict(values, source=str(file))

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some fields changed (``config.replace(num_labels=5)``).

        Raises:
            ModelSourceError: a name that is not a field of BertConfig.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ModelSourceError(
                f"BertConfig has no field {', '.join(map(repr, unknown))}; "
                f"fields are {', '.join(sorted(fields))}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The keys of a HuggingFace ``config.json`` (``model_type`` included)."""
        values = dataclasses.asdict(self)
        values.pop("attn_implementation")
        values["id2label"] = {str(i): f"LABEL_{i}" for i in range(self.num_labels)}
        values["label2id"] = {f"LABEL_{i}": i for i in range(self.num_labels)}
        values.pop("num_labels")
        values["model_type"] = "bert"
        values["position_embedding_type"] = "absolute"
        return values
