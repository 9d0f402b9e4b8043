"""BERT from scratch in plain PyTorch, with every head HuggingFace's BERT has.

Read top to bottom: from the smallest part (an activation) through embeddings, one
self-attention, one encoder block, the encoder and the pooler to ``BertModel``, then the
heads' parts and the heads. Shapes use B (batch), S (sequence length), H (hidden size),
nh (heads), hd (head width), I (intermediate size), V (vocabulary), C (choices).

Attribute names are HuggingFace's checkpoint keys (``encoder.layer.3.attention.self.query``)
so a state dict loads with no mapping, and the kernels are the ones HF calls, in the same
order (``F.linear``, erf GELU, ``F.layer_norm``, the same scaling and mask), so on CPU fp32
the outputs are bit-identical to ``transformers`` with the same attention path.

Places meant to be changed on a loaded model, to inject a fault or try a variant:

- ``encoder.layer[i].intermediate.intermediate_act_fn``: the activation module;
- ``encoder.layer[i].attention.self.scaling``: the float that multiplies q·k;
- ``encoder.layer[i].attention.self.attn_implementation``: ``"sdpa"`` or ``"eager"``;
- ``...LayerNorm.eps``: any LayerNorm's epsilon.

Example::

    >>> model = BertForSequenceClassification.from_pretrained(folder)
    >>> with torch.no_grad():
    ...     out = model(input_ids=ids, attention_mask=mask)
    >>> out.logits.shape
    torch.Size([2, 2])
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from introspect.scratch.config import BertConfig
from introspect.scratch.loading import (
    INIT_SEED,
    LoadingReport,
    LoadingWarning,
    check_fits,
    load_state,
    read_checkpoint,
    read_hf_module,
    save_checkpoint,
    tied_aliases,
)
from introspect.scratch.outputs import (
    BaseModelOutputWithPooling,
    BertForPreTrainingOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

ModelT = TypeVar("ModelT", bound="BertPreTrainedModel")


# ----------------------------------------------------------------------------------------
# Activations


class NewGELU(nn.Module):
    """GELU's tanh approximation written out, as in Google's BERT (HF's ``gelu_new``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            0.5
            * x
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        )


def activation(name: str) -> nn.Module:
    """The activation module HF's ``ACT2FN[name]`` computes, with the same kernel."""
    modules: dict[str, Callable[[], nn.Module]] = {
        "gelu": lambda: nn.GELU(),  # erf GELU: F.gelu(x)
        "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
        "gelu_new": NewGELU,
        "relu": nn.ReLU,
        "silu": nn.SiLU,
        "swish": nn.SiLU,
        "tanh": nn.Tanh,
    }
    return modules[name]()


# ----------------------------------------------------------------------------------------
# Embeddings


def _position_buffers(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The position ids 0, 1, 2... and the all-zero segment ids, each (1, length)."""
    positions = torch.arange(length).expand((1, -1))
    return positions, torch.zeros_like(positions)


class BertEmbeddings(nn.Module):
    """Token + segment + position embeddings, then LayerNorm and dropout."""

    position_ids: torch.Tensor  # buffer (1, max_pos): 0, 1, 2, ...
    token_type_ids: torch.Tensor  # buffer (1, max_pos): zeros, the segment when none is given

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Buffers, not inputs: a traced graph slices them to the sequence length it is given.
        positions, segments = _position_buffers(config.max_position_embeddings)
        self.register_buffer("position_ids", positions, persistent=False)  # (1, max_pos)
        self.register_buffer("token_type_ids", segments, persistent=False)

    def reset_buffers(self) -> None:
        """Fill the buffers again (a model built on the meta device has none to keep)."""
        self.position_ids, self.token_type_ids = _position_buffers(self.position_ids.shape[-1])

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        S = input_ids.shape[1]
        if position_ids is None:
            position_ids = self.position_ids[:, :S]  # (1, S)
        if token_type_ids is None:
            token_type_ids = self.token_type_ids[:, :S].expand_as(input_ids)  # (B, S)
        x = self.word_embeddings(input_ids)  # (B, S, H)
        x = x + self.token_type_embeddings(token_type_ids)  # (B, S, H)
        x = x + self.position_embeddings(position_ids)  # (B, S, H) + (1, S, H)
        return self.dropout(self.LayerNorm(x))


# ----------------------------------------------------------------------------------------
# Attention


def padding_mask(
    attention_mask: torch.Tensor | None, hidden_states: torch.Tensor, attn_implementation: str
) -> torch.Tensor | None:
    """The mask every self-attention gets, built as HF builds it for a bidirectional model.

    A 2-D ``attention_mask`` (1 = token, 0 = padding) becomes a (B, 1, S, S) mask over the
    keys: boolean for ``sdpa``, additive (0 or the dtype's minimum) for ``eager``. A 4-D
    mask is taken as already built. The mask is built whenever one is given, also when it
    is all ones (HF skips it then, which gives the same numbers; a graph cannot branch on
    values).
    """
    if attention_mask is None:
        return None
    if attention_mask.ndim == 4:
        return attention_mask
    B, S = hidden_states.shape[0], hidden_states.shape[1]
    keep = attention_mask.to(device=hidden_states.device, dtype=torch.bool)  # (B, S)
    keep = keep[:, None, None, :].expand(B, 1, S, S)  # (B, 1, S, S), True = attend
    if attn_implementation == "sdpa":
        return keep
    return additive_mask(keep, hidden_states.dtype)


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean keep-mask as eager attention adds it: 0 where kept, dtype minimum elsewhere."""
    zero = torch.zeros((), device=keep.device, dtype=dtype)
    return torch.where(keep, zero, torch.finfo(dtype).min)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: project to q, k, v, attend per head, join the heads.

    ``scaling`` multiplies q·k (1/sqrt(hd)); ``attn_implementation`` picks the fused
    ``F.scaled_dot_product_attention`` ("sdpa") or the explicit matmul, scale, mask,
    softmax, matmul ("eager"). Both are plain attributes, so they can be changed per layer.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.head_dim
        self.scaling = self.attention_head_size**-0.5
        self.attn_implementation = config.attn_implementation
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, S = x.shape[0], x.shape[1]
        nh, hd = self.num_attention_heads, self.attention_head_size
        q = self.query(x).view(B, S, nh, hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.key(x).view(B, S, nh, hd).transpose(1, 2)  # (B, nh, S, hd)
        v = self.value(x).view(B, S, nh, hd).transpose(1, 2)  # (B, nh, S, hd)
        if self.attn_implementation == "eager":
            y = self.eager_attention(q, k, v, mask)  # (B, nh, S, hd)
        else:
            dropout_p = self.dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scaling
            )  # (B, nh, S, hd)
        y = y.transpose(1, 2).contiguous()  # (B, S, nh, hd)
        return y.reshape(B, S, nh * hd)  # (B, S, H)

    def eager_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """softmax(q·kᵀ · scaling + mask) · v, one op at a time."""
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling  # (B, nh, S, S)
        if mask is not None:
            if mask.dtype == torch.bool:  # a mask built for sdpa (this layer was switched)
                mask = additive_mask(mask, scores.dtype)
            scores = scores + mask  # (B, nh, S, S) + (B, 1, S, S)
        probs = self.dropout(F.softmax(scores, dim=-1))  # (B, nh, S, S)
        return torch.matmul(probs, v)  # (B, nh, S, hd)


class ProjectAddNorm(nn.Module):
    """Project to H, dropout, then residual add and LayerNorm: how both sub-blocks end."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.dense(x))  # (B, S, H)
        return self.LayerNorm(x + residual)


class BertSelfOutput(ProjectAddNorm):
    """Project the joined heads back to H, then residual add and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, in_features=config.hidden_size)


class BertAttention(nn.Module):
    """Self-attention, then its output projection (``attention.self``, ``attention.output``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


# ----------------------------------------------------------------------------------------
# Feed-forward and the encoder block


class BertIntermediate(nn.Module):
    """The feed-forward block's widening half: H -> I, then the activation."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))  # (B, S, I)


class BertOutput(ProjectAddNorm):
    """The feed-forward block's narrowing half: I -> H, then residual add and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, in_features=config.intermediate_size)


class BertLayer(nn.Module):
    """One encoder block: attention, then feed-forward, each with residual and post-LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.attention(x, mask)  # (B, S, H)
        return self.output(self.intermediate(x), x)  # (B, S, H)


class BertEncoder(nn.Module):
    """The stack of L encoder blocks."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, output_hidden_states: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Returns the last block's output and, if asked, the input and every block's output."""
        all_states = [x]
        for block in self.layer:
            x = block(x, mask)  # (B, S, H)
            all_states.append(x)
        return x, tuple(all_states) if output_hidden_states else None


class BertPooler(nn.Module):
    """The [CLS] token's vector through a dense layer and tanh: one vector per sequence."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        first_token = hidden_states[:, 0]  # (B, H)
        return self.activation(self.dense(first_token))  # (B, H)


# ----------------------------------------------------------------------------------------
# What every model shares: construction, initialisation, loading


class BertPreTrainedModel(nn.Module):
    """Base of ``BertModel`` and the heads: weight init, ``from_pretrained``, ``from_hf``.

    Attributes:
        config: the ``BertConfig`` the model was built from.
        loading_report: what ``from_pretrained``/``from_hf`` loaded, initialised and
            left unused (``None`` for a model built from a config).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.loading_report: LoadingReport | None = None

    def init_weights(self, seed: int = INIT_SEED) -> None:
        """Draw the weights as HF does (normal(0, initializer_range), LayerNorm 1/0) from ``seed``.

        A head leaves its ``bert`` alone: the ``BertModel`` drew its weights when it was built.
        """
        generator = torch.Generator().manual_seed(seed)
        std = self.config.initializer_range
        backbone = getattr(self, "bert", None)  # a head's BertModel drew its own weights
        done = {id(p) for p in backbone.parameters()} if isinstance(backbone, BertModel) else set()
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, BertLMPredictionHead):
                    module.bias.zero_()
                weight = getattr(module, "weight", None)
                if weight is None or id(weight) in done:  # not a layer, or tied to a drawn one
                    continue
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    weight.normal_(0.0, std, generator=generator)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    module.bias.zero_()
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    weight[module.padding_idx].zero_()
                if isinstance(module, nn.LayerNorm):
                    weight.fill_(1.0)
                    module.bias.zero_()

    def set_attn_implementation(self, attn_implementation: str) -> None:
        """Switch every self-attention (and the mask) to ``"sdpa"`` or ``"eager"``.

        Raises:
            ModelSourceError: another name.
        """
        self.config = self.config.replace(attn_implementation=attn_implementation)
        for module in self.modules():
            if isinstance(module, (BertSelfAttention, BertModel)):
                module.attn_implementation = attn_implementation
            if isinstance(module, BertPreTrainedModel):
                module.config = self.config

    @classmethod
    def from_pretrained(
        cls: type[ModelT],
        folder: str | os.PathLike[str],
        *,
        strict: bool = False,
        attn_implementation: str | None = None,
        dtype: torch.dtype | None = None,
        **config_changes: Any,
    ) -> ModelT:
        """Load a HuggingFace BERT checkpoint folder (config.json + safetensors or .bin).

        Weights are read from ``model.safetensors`` (or its sharded index) first and from
        ``pytorch_model.bin`` with ``torch.load(weights_only=True)`` only if there is no
        safetensors file. Keys with or without the ``bert.`` prefix and old
        ``LayerNorm.gamma``/``beta`` names are accepted. Head weights the checkpoint lacks
        (a classifier on a base-model checkpoint) are drawn from seed ``INIT_SEED`` and a
        ``LoadingWarning`` says which; head weights the model has no place for (another
        head's) are left unused and said too. Both are listed in ``model.loading_report``.

        Args:
            folder: the checkpoint folder.
            strict: raise instead of warning when head weights are missing or unused.
            attn_implementation: ``"sdpa"`` or ``"eager"``; default: config.json's, else sdpa.
            dtype: the parameters' dtype; default float32.
            **config_changes: config fields to override, e.g. ``num_labels=5``.

        Returns:
            The model, in eval mode.

        Raises:
            ModelSourceError: no folder, config or weights; a backbone key missing or
                unexpected; a shape that does not fit (the message names the key and
                both shapes); with ``strict``, any head key missing or unused.

        Example::

            >>> model = BertForMaskedLM.from_pretrained("bert-base-uncased/")
            >>> model.loading_report.initialized
            ()
        """
        config, state, source = read_checkpoint(folder)
        if attn_implementation is not None:
            config_changes["attn_implementation"] = attn_implementation
        return cls._from_state(config.replace(**config_changes), state, source, strict, dtype)

    @classmethod
    def from_hf(
        cls: type[ModelT],
        hf_model: nn.Module,
        *,
        strict: bool = False,
        attn_implementation: str | None = None,
        **config_changes: Any,
    ) -> ModelT:
        """Build this model from a HuggingFace ``BertModel``/``BertFor*`` held in memory.

        The config comes from ``hf_model.config`` (its attention implementation included)
        and the weights from ``hf_model.state_dict()``, with the same checks and reports as
        ``from_pretrained``; the parameters take the HF model's dtype.

        Args:
            hf_model: any HF BERT module (a base model for a head class is fine: the head
                is initialised from seed ``INIT_SEED`` and a warning says so).
            strict: raise instead of warning when head weights are missing or unused.
            attn_implementation: override the HF model's attention implementation.
            **config_changes: config fields to override.

        Returns:
            The model, in eval mode.

        Raises:
            ModelSourceError: as ``from_pretrained``.
        """
        config, state = read_hf_module(hf_model)
        if attn_implementation is not None:
            config_changes["attn_implementation"] = attn_implementation
        dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
        source = f"{type(hf_model).__name__} in memory"
        return cls._from_state(config.replace(**config_changes), state, source, strict, dtype)

    @classmethod
    def _from_state(
        cls: type[ModelT],
        config: BertConfig,
        state: dict[str, torch.Tensor],
        source: str,
        strict: bool,
        dtype: torch.dtype | None,
    ) -> ModelT:
        check_fits(config, state, source)  # before allocating the model
        model = _materialised(cls, config)
        model.loading_report = load_state(model, state, source, strict=strict)
        if model.loading_report.initialized:
            # Head weights the checkpoint lacks: drawn as a model built on the CPU draws
            # them (from INIT_SEED, in module order), then the loaded values go back on top.
            model.init_weights()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LoadingWarning)  # said once already
                load_state(model, state, source, strict=strict)
        if dtype is not None:
            model.to(dtype)
        return model.eval()

    def save_pretrained(self, folder: str | os.PathLike[str]) -> None:
        """Write config.json and model.safetensors that HF's ``from_pretrained`` reads.

        Raises:
            ModelSourceError: the folder cannot be written.
        """
        save_checkpoint(self, folder)


def _materialised(cls: type[ModelT], config: BertConfig) -> ModelT:
    """``cls(config)`` with its memory allocated but no weight drawn or initialised.

    A model about to be filled from a checkpoint need not draw weights that the
    checkpoint replaces (a fifth of a second for MiniLM): it is built on the meta device,
    then given real, uninitialised memory. ``to_empty`` gives shared parameters (the MLM
    decoder tied to the word embeddings) one tensor each: they are shared again here.
    """
    with torch.device("meta"):
        model = cls(config)
    aliases = tied_aliases(model)
    model.to_empty(device="cpu")
    for alias, first in aliases.items():
        owner, _, leaf = alias.rpartition(".")
        setattr(model.get_submodule(owner), leaf, model.get_parameter(first))
    for module in model.modules():
        if isinstance(module, BertEmbeddings):
            module.reset_buffers()
    return model


# ----------------------------------------------------------------------------------------
# The base model


class BertModel(BertPreTrainedModel):
    """Embeddings, encoder and (optionally) pooler; the backbone of every head."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.attn_implementation = config.attn_implementation  # picks the mask's kind
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BaseModelOutputWithPooling:
        """Run BERT on token ids (B, S); ``attention_mask`` is 1 for tokens, 0 for padding.

        Returns:
            ``last_hidden_state`` (B, S, H), ``pooler_output`` (B, H) if the model has a
            pooler, and with ``output_hidden_states`` the embeddings and every block's output.
        """
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, S, H)
        mask = padding_mask(attention_mask, x, self.attn_implementation)  # (B, 1, S, S)
        x, hidden_states = self.encoder(x, mask, output_hidden_states)  # (B, S, H)
        pooled = self.pooler(x) if self.pooler is not None else None  # (B, H)
        return BaseModelOutputWithPooling(
            last_hidden_state=x, pooler_output=pooled, hidden_states=hidden_states
        )


# ----------------------------------------------------------------------------------------
# Parts of the heads


class BertPredictionHeadTransform(nn.Module):
    """Dense, activation and LayerNorm applied to each token before the vocabulary projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))  # (B, S, H)


class BertLMPredictionHead(nn.Module):
    """Masked-LM logits: transform, then a projection to the vocabulary.

    With ``tie_word_embeddings`` (the default) the decoder's weight is the word-embedding
    matrix and its bias is ``bias``: one parameter each, as in HF's checkpoints.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        if config.tie_word_embeddings:
            self.decoder.bias = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (B, S, V)


class BertOnlyMLMHead(nn.Module):
    """The masked-LM head alone (``cls.predictions``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return self.predictions(sequence_output)  # (B, S, V)


class BertOnlyNSPHead(nn.Module):
    """The next-sentence head alone (``cls.seq_relationship``)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.seq_relationship(pooled_output)  # (B, 2)


class BertPreTrainingHeads(nn.Module):
    """Both pretraining heads: masked-LM on every token, next-sentence on the pooled vector."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(
        self, sequence_output: torch.Tensor, pooled_output: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


def tie_decoder(bert: BertModel, predictions: BertLMPredictionHead, config: BertConfig) -> None:
    """Make the MLM decoder's weight the word-embedding matrix (when the config ties them)."""
    if config.tie_word_embeddings:
        predictions.decoder.weight = bert.embeddings.word_embeddings.weight


def classifier_dropout(config: BertConfig) -> nn.Dropout:
    """The dropout before a classifier: ``classifier_dropout``, else ``hidden_dropout_prob``."""
    p = config.classifier_dropout
    return nn.Dropout(config.hidden_dropout_prob if p is None else p)


# ----------------------------------------------------------------------------------------
# Losses, as HF computes them


def sequence_classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, config: BertConfig
) -> torch.Tensor:
    """MSE, cross-entropy or BCE-with-logits, chosen like HF.

    ``config.problem_type`` decides; without one, one label means regression, integer
    labels single-label classification, float labels multi-label classification.
    """
    problem_type = config.problem_type
    if problem_type is None:
        if config.num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        if config.num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, config.num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels)


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
) -> torch.Tensor:
    """Mean of start and end cross-entropies; positions past the sequence are ignored, as in HF."""
    if start_positions.ndim > 1:
        start_positions = start_positions.squeeze(-1)  # (B,)
    if end_positions.ndim > 1:
        end_positions = end_positions.squeeze(-1)  # (B,)
    ignored_index = start_logits.size(1)
    start_positions = start_positions.clamp(0, ignored_index)
    end_positions = end_positions.clamp(0, ignored_index)
    start_loss = F.cross_entropy(start_logits, start_positions, ignore_index=ignored_index)
    end_loss = F.cross_entropy(end_logits, end_positions, ignore_index=ignored_index)
    return (start_loss + end_loss) / 2


# ----------------------------------------------------------------------------------------
# The heads


class BertForPreTraining(BertPreTrainedModel):
    """BERT as pretrained: masked-LM and next-sentence prediction; loss is their sum."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        tie_decoder(self.bert, self.cls.predictions, config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BertForPreTrainingOutput:
        """``labels`` (B, S): token ids, -100 where not masked.

        ``next_sentence_label`` (B,): 0 if sentence B follows A, 1 if it is random.
        """
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        prediction_logits, seq_relationship_logits = self.cls(
            out.last_hidden_state, out.pooler_output
        )
        loss = None
        if labels is not None and next_sentence_label is not None:
            mlm_loss = F.cross_entropy(
                prediction_logits.view(-1, self.config.vocab_size), labels.view(-1)
            )
            nsp_loss = F.cross_entropy(
                seq_relationship_logits.view(-1, 2), next_sentence_label.view(-1)
            )
            loss = mlm_loss + nsp_loss
        return BertForPreTrainingOutput(
            loss=loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=out.hidden_states,
        )


class BertForMaskedLM(BertPreTrainedModel):
    """Fill in masked tokens: vocabulary logits for every position."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        tie_decoder(self.bert, self.cls.predictions, config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> MaskedLMOutput:
        """``labels`` (B, S): the original token ids, -100 where the loss should not look."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        logits = self.cls(out.last_hidden_state)  # (B, S, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class BertForNextSentencePrediction(BertPreTrainedModel):
    """Does sentence B follow sentence A? Two logits per pair (0: is next, 1: random)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertOnlyNSPHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> NextSentencePredictorOutput:
        """``labels`` (B,): 0 if B follows A, 1 if B is random."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        logits = self.cls(out.pooler_output)  # (B, 2)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, 2), labels.view(-1))
        return NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states
        )


class BertForSequenceClassification(BertPreTrainedModel):
    """One label (or score) per sequence from the pooled [CLS] vector."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> SequenceClassifierOutput:
        """``labels``: (B,) class ids; (B,) floats to regress; (B, num_labels) 0/1 floats."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        loss = (
            sequence_classification_loss(logits, labels, self.config)
            if labels is not None
            else None
        )
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class BertForMultipleChoice(BertPreTrainedModel):
    """Pick one of C candidate sequences: inputs are (B, C, S), one logit per choice."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> MultipleChoiceModelOutput:
        """Every input is (B, C, S); ``labels`` (B,): the index of the right choice."""
        C = input_ids.shape[1]
        flat = [
            t.view(-1, t.shape[-1]) if t is not None else None  # (B*C, S)
            for t in (input_ids, attention_mask, token_type_ids, position_ids)
        ]
        out = self.bert(*flat, output_hidden_states=output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output)).view(-1, C)  # (B, C)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class BertForTokenClassification(BertPreTrainedModel):
    """One label per token (named entities, parts of speech)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> TokenClassifierOutput:
        """``labels`` (B, S): class ids, -100 where the loss should not look."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, S, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1))
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA: a start and an end logit for every token of the context."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> QuestionAnsweringModelOutput:
        """``start_positions``/``end_positions`` (B,): the answer span's token indices."""
        out = self.bert(
            input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states
        )
        logits = self.qa_outputs(out.last_hidden_state)  # (B, S, 2)
        start_logits = logits[..., 0].contiguous()  # (B, S)
        end_logits = logits[..., 1].contiguous()  # (B, S)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=out.hidden_states,
        )


# Head classes by HF's architecture name (config.json's "architectures").
MODELS: dict[str, type[BertPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForSequenceClassification,
        BertForMultipleChoice,
        BertForTokenClassification,
        BertForQuestionAnswering,
    )
}
