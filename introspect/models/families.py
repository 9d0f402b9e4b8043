"""The BERT family and its cousins: what differs between them, in one table.

Each family is a ``Family``: its ``model_type`` (the key of a checkpoint's config.json), the
HF classes of its heads, the inputs its ``forward`` takes, and the published sizes of the
random-init model named after it (``roberta-base``, ``gpt2``, ...). ``introspect.models.load``
builds models from this table; ``introspect.tracing.shapes`` labels layers with ``layer_prefix``.

What is approximated, for every family: the tokenizer is the embedded uncased WordPiece
vocab of all-MiniLM-L6-v2 (30522 tokens), whatever the family uses in reality (RoBERTa,
GPT-2 and Llama use byte-level BPE or SentencePiece). Random-init models are therefore
sized to that vocab (``vocab_size`` 30522, ``pad_token_id`` 0, BERT's ``[PAD]``), so every
id the tokenizer produces is an id the model has; all other sizes are the published ones.

Example::

    >>> FAMILIES["gpt2"].heads["causal-lm"]
    'GPT2LMHeadModel'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The size of the embedded vocab (introspect.models.load.minilm_folder()/vocab.txt).
EMBEDDED_VOCAB = 30522
ENCODER_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
NO_SEGMENT_INPUTS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class Family:
    """One model family: its HF classes, inputs, layer labels and random-init config."""

    model_type: str  # config.json's "model_type"
    config_class: str  # transformers' config class
    heads: dict[str, str]  # CLI head name -> HF class name
    inputs: tuple[str, ...]  # what the tokenizer hands the model, in order
    layer_prefix: str  # layer label before the index: "encoder.layer", "h", "layers"
    decoder: bool = False  # causal: traced with use_cache=False
    random_config: dict[str, Any] = field(default_factory=dict)  # published sizes


def _heads(prefix: str, *names: str) -> dict[str, str]:
    suffixes = {"base": "Model", "sequence-classification": "ForSequenceClassification",
                "masked-lm": "ForMaskedLM", "token-classification": "ForTokenClassification",
                "question-answering": "ForQuestionAnswering",
                "multiple-choice": "ForMultipleChoice", "pretraining": "ForPreTraining",
                "causal-lm": "ForCausalLM"}
    return {name: prefix + suffixes[name] for name in names}


_ENCODER_HEADS = ("base", "sequence-classification", "masked-lm", "token-classification",
                  "question-answering", "multiple-choice")
_SMALL_VOCAB = {"vocab_size": EMBEDDED_VOCAB, "pad_token_id": 0}

FAMILIES: dict[str, Family] = {
    "roberta": Family(
        "roberta", "RobertaConfig", _heads("Roberta", *_ENCODER_HEADS), NO_SEGMENT_INPUTS,
        "encoder.layer",
        # roberta-base; positions start after the padding id, hence 514 positions
        random_config={**_SMALL_VOCAB, "hidden_size": 768, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "intermediate_size": 3072,
                       "max_position_embeddings": 514, "type_vocab_size": 1}),
    "distilbert": Family(
        "distilbert", "DistilBertConfig", _heads("DistilBert", *_ENCODER_HEADS),
        NO_SEGMENT_INPUTS, "transformer.layer",
        random_config={**_SMALL_VOCAB, "dim": 768, "n_layers": 6, "n_heads": 12,
                       "hidden_dim": 3072}),
    "electra": Family(
        "electra", "ElectraConfig", _heads("Electra", *_ENCODER_HEADS, "pretraining"),
        ENCODER_INPUTS, "encoder.layer",
        # electra-small discriminator: embeddings of 128 projected to hidden 256
        random_config={**_SMALL_VOCAB, "embedding_size": 128, "hidden_size": 256,
                       "num_hidden_layers": 12, "num_attention_heads": 4,
                       "intermediate_size": 1024}),
    "albert": Family(
        "albert", "AlbertConfig", _heads("Albert", *_ENCODER_HEADS, "pretraining"),
        ENCODER_INPUTS, "encoder.layer",
        # albert-base-v2: one shared layer run 12 times
        random_config={**_SMALL_VOCAB, "embedding_size": 128, "hidden_size": 768,
                       "num_hidden_layers": 12, "num_attention_heads": 12,
                       "intermediate_size": 3072, "hidden_act": "gelu_new"}),
    "gpt2": Family(
        "gpt2", "GPT2Config",
        {**_heads("GPT2", "base", "sequence-classification", "token-classification",
                  "question-answering"), "causal-lm": "GPT2LMHeadModel"},
        NO_SEGMENT_INPUTS, "h", decoder=True,
        random_config={**_SMALL_VOCAB, "n_embd": 768, "n_layer": 12, "n_head": 12,
                       "n_positions": 1024}),
    "llama": Family(
        "llama", "LlamaConfig",
        _heads("Llama", "base", "sequence-classification", "token-classification",
               "question-answering", "causal-lm"),
        NO_SEGMENT_INPUTS, "layers", decoder=True,
        # not a published checkpoint: a small Llama with every part of the big ones
        # (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention: 8 heads, 2 kv)
        random_config={**_SMALL_VOCAB, "hidden_size": 256, "num_hidden_layers": 4,
                       "num_attention_heads": 8, "num_key_value_heads": 2,
                       "intermediate_size": 688, "max_position_embeddings": 2048}),
}

# Random-init model names of the cousins -> family (BERT's own are in introspect.models.load).
RANDOM_MODELS: dict[str, str] = {
    "roberta-base": "roberta", "distilbert-base": "distilbert", "electra-small": "electra",
    "albert-base": "albert", "gpt2": "gpt2", "llama-tiny": "llama",
}

# Families that load but cannot be traced, and why (checked before tracing).
UNTRACEABLE: dict[str, str] = {
    "DebertaV2": "DeBERTa-v2 cannot be traced with torch.fx (its attention makes a tensor "
                 "of a traced size)",
}


def family_of_model(model: Any) -> Family | None:
    """The family of an HF model (by its config's ``model_type``), None for BERT and others."""
    config = getattr(model, "config", None)
    return FAMILIES.get(getattr(config, "model_type", ""))


def untraceable_reason(model: Any) -> str | None:
    """Why ``model`` cannot be traced, for a known family that cannot; None otherwise."""
    name = type(model).__name__
    return next((why for prefix, why in UNTRACEABLE.items() if name.startswith(prefix)), None)


def build_config(family: Family, attn: str, **overrides: Any) -> Any:
    """The family's random-init config (published sizes unless overridden), decoders uncached.

    Raises:
        ImportError: transformers lacks the family's config class.
    """
    import transformers

    config_class = getattr(transformers, family.config_class)
    values = {**family.random_config, **overrides}
    if family.decoder:
        values["use_cache"] = False
    return config_class(**values, attn_implementation=attn)


__all__ = ["EMBEDDED_VOCAB", "FAMILIES", "Family", "RANDOM_MODELS", "UNTRACEABLE",
           "build_config", "family_of_model", "untraceable_reason"]
