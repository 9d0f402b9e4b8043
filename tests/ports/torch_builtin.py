"""A BERT port built from PyTorch's own blocks, as many people port it.

Written for the tests on purpose, independently of ``introspect`` (it imports only torch):
embeddings as ``nn.Embedding`` sums and ``nn.LayerNorm``; each encoder layer an
``nn.TransformerEncoderLayer(..., activation="gelu", batch_first=True, norm_first=False)``
whose ``self_attn`` is an ``nn.MultiheadAttention`` holding q, k and v fused in one
``in_proj_weight`` (3H, H); the padding mask passed as ``src_key_padding_mask`` (True where
padded); the pooler ``Linear`` + tanh. Weights come from an HF ``BertModel`` (or
``BertFor*``) through an explicit key mapping with every shape checked.

In eval mode with no grad, ``nn.TransformerEncoderLayer`` may run its fused "fast path"
(``torch._transformer_encoder_layer_fwd``); torch skips it whenever an argument has a
``__torch_function__`` (so under torch.fx's tracing the layer runs its Python path), and
when the activation is not ReLU/GELU or ``norm_first`` etc. differ. Either path gives the
same values within fp32 noise. The fast path reads only the activation's kind recorded at
construction (``activation_relu_or_gelu``), so a fault must be injected as a person would
make it, at construction, not by swapping ``.activation`` afterwards.

``introspect.trace`` keeps ``nn.TransformerEncoderLayer`` whole (a ``torch.nn`` module is a
leaf for torch.fx): one node per encoder layer, reading all twelve of its weights.

``build(reference, fault=None, layer=0)`` returns the port in eval mode; ``fault`` injects
one classic porting bug (see ``FAULTS``) into encoder layer ``layer`` (or into the
embeddings / pooler where the bug lives there).
"""

from __future__ import annotations

import torch
from torch import nn

FAULTS = (
    "qk_swapped", "kv_swapped", "position_offset", "token_type_ignored", "mask_missing",
    "pre_ln", "ln_eps", "gelu_tanh", "relu", "pooler_no_tanh",
    "dropout_active", "weight_transposed", "layer_missing", "weight_from_other_layer",
)


class Embeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, H)
        self.position = nn.Embedding(config.max_position_embeddings, H)
        self.token_type = nn.Embedding(config.type_vocab_size, H)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.position_start = 0
        self.use_token_type = True

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        positions = torch.arange(self.position_start, self.position_start + S,
                                 device=input_ids.device)  # (S,)
        x = self.word(input_ids) + self.position(positions)  # (B, S, H)
        if self.use_token_type:
            x = x + self.token_type(token_type_ids)
        return self.norm(x)


class BuiltinBert(nn.Module):
    """Returns ``(last_hidden_state, pooler_output)``."""

    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(H, config.num_attention_heads, config.intermediate_size,
                                       dropout=config.hidden_dropout_prob, activation="gelu",
                                       layer_norm_eps=config.layer_norm_eps, batch_first=True,
                                       norm_first=False)
            for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(H, H)
        self.pooler_tanh = True
        self.mask = True  # False: src_key_padding_mask left out

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embeddings(input_ids, token_type_ids)
        padded = attention_mask == 0 if self.mask else None  # (B, S) True where padded
        for block in self.layers:
            x = block(x, src_key_padding_mask=padded)
        pooled = self.pooler(x[:, 0])  # (B, H): the [CLS] token
        return x, torch.tanh(pooled) if self.pooler_tanh else pooled


def _key_map(layers: int) -> dict[str, str | tuple[str, ...]]:
    """Port parameter -> HF parameter(s); a tuple is concatenated along dim 0 (q, k, v)."""
    keys: dict[str, str | tuple[str, ...]] = {
        "embeddings.word.weight": "embeddings.word_embeddings.weight",
        "embeddings.position.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.norm.weight": "embeddings.LayerNorm.weight",
        "embeddings.norm.bias": "embeddings.LayerNorm.bias",
        "pooler.weight": "pooler.dense.weight",
        "pooler.bias": "pooler.dense.bias",
    }
    parts = {
        "self_attn.out_proj": "attention.output.dense", "norm1": "attention.output.LayerNorm",
        "linear1": "intermediate.dense", "linear2": "output.dense", "norm2": "output.LayerNorm",
    }
    for i in range(layers):
        theirs = f"encoder.layer.{i}."
        for p in ("weight", "bias"):
            keys[f"layers.{i}.self_attn.in_proj_{p}"] = tuple(
                f"{theirs}attention.self.{n}.{p}" for n in ("query", "key", "value"))
            for mine, hf in parts.items():
                keys[f"layers.{i}.{mine}.{p}"] = f"{theirs}{hf}.{p}"
    return keys


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> BuiltinBert:
    """The port holding ``reference``'s weights, with ``fault`` injected (None: correct)."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    base = getattr(reference, "bert", reference)
    state, config = base.state_dict(), base.config
    port = BuiltinBert(config)
    keys = _key_map(config.num_hidden_layers)
    mine, theirs = f"layers.{layer}.", f"encoder.layer.{layer}.attention.self."
    other = f"encoder.layer.{(layer + 1) % config.num_hidden_layers}."
    transpose: set[str] = set()
    for p in ("weight", "bias"):
        q, k, v = (f"{theirs}{n}.{p}" for n in ("query", "key", "value"))
        if fault == "qk_swapped":
            keys[f"{mine}self_attn.in_proj_{p}"] = (k, q, v)
        elif fault == "kv_swapped":
            keys[f"{mine}self_attn.in_proj_{p}"] = (q, v, k)
    if fault == "weight_transposed":
        transpose.add(f"{mine}self_attn.out_proj.weight")
    elif fault == "weight_from_other_layer":
        keys[f"{mine}linear2.weight"] = f"{other}output.dense.weight"

    with torch.no_grad():
        for name, tensor in port.state_dict().items():
            source = keys[name]
            value = (torch.cat([state[s] for s in source]) if isinstance(source, tuple)
                     else state[source])
            if name in transpose:
                value = value.t()
            if value.shape != tensor.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} but {source} "
                                 f"has {tuple(value.shape)}")
            tensor.copy_(value)

    block = port.layers[layer]
    if fault == "position_offset":
        port.embeddings.position_start = 1
    elif fault == "token_type_ignored":
        port.embeddings.use_token_type = False
    elif fault == "mask_missing":
        port.mask = False
    elif fault == "pre_ln":
        block.norm_first = True
    elif fault == "ln_eps":
        block.norm1.eps = 1e-3  # a typo-sized eps: BERT uses 1e-12
    elif fault == "gelu_tanh":  # as if built with activation=lambda x: F.gelu(x, "tanh")
        block.activation = nn.GELU(approximate="tanh")
        block.activation_relu_or_gelu = 0  # a callable: the fused fast path is not taken
    elif fault == "relu":  # as if built with TransformerEncoderLayer's default activation
        block.activation = nn.ReLU()
        block.activation_relu_or_gelu = 1
    elif fault == "pooler_no_tanh":
        port.pooler_tanh = False
    elif fault == "layer_missing":
        del port.layers[layer]  # one layer short: the loop over layers skips it
    port.eval()
    if fault == "dropout_active":
        block.train()  # one layer switched back to training (its dropouts active)
    return port
