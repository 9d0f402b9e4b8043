"""A BERT port built from PyTorch's own layers: ``nn.TransformerEncoderLayer``.

Written for the tests on purpose, independently of ``introspect`` (it imports only torch),
the way many people port BERT: embeddings summed and normalised, then a stack of
``nn.TransformerEncoderLayer(batch_first=True, norm_first=False, activation="gelu")``
whose ``nn.MultiheadAttention`` holds query, key and value in one fused ``in_proj_weight``,
and the padding given as ``src_key_padding_mask``. Weights come from an HF ``BertModel``
through an explicit key mapping with every shape checked.

``build(reference, fault=None, layer=0)`` returns the port in eval mode; ``fault`` injects
one porting bug that this style invites into encoder layer ``layer`` (or the embeddings):

- ``default_eps``: ``layer_norm_eps`` not passed, so the layer's 1e-5 default stands
  where BERT's checkpoints use 1e-12;
- ``in_proj_kqv``: query and key concatenated in the other order into ``in_proj_weight``;
- ``norm_first``: ``norm_first=True``, the pre-LN layer, where BERT is post-LN;
- ``no_padding_mask``: ``src_key_padding_mask`` left out;
- ``position_offset``: positions counted from 1.
"""

from __future__ import annotations

import torch
from torch import nn

FAULTS = ("default_eps", "in_proj_kqv", "norm_first", "no_padding_mask", "position_offset")


class TorchLayersBert(nn.Module):
    def __init__(self, config, eps: list[float], norm_first: list[bool]) -> None:
        super().__init__()
        H = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, H, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, H)
        self.segment = nn.Embedding(config.type_vocab_size, H)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(H, config.num_attention_heads, config.intermediate_size,
                                       dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=first, layer_norm_eps=e)
            for e, first in zip(eps, norm_first, strict=True))
        self.position_start = 0
        self.padding_mask = True

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[1]
        positions = torch.arange(self.position_start, S + self.position_start)
        x = self.word(input_ids) + self.segment(token_type_ids) + self.position(positions)[None]
        x = self.norm(x)
        padding = attention_mask == 0 if self.padding_mask else None
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        return x


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding ``reference``'s weights (an HF BertModel), with ``fault`` in ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    config = reference.config
    n = config.num_hidden_layers
    eps = [1e-5 if fault == "default_eps" and i == layer else config.layer_norm_eps
           for i in range(n)]
    norm_first = [fault == "norm_first" and i == layer for i in range(n)]
    port = TorchLayersBert(config, eps, norm_first)
    state = {k.removeprefix("bert."): v for k, v in reference.state_dict().items()}

    def load(target: torch.Tensor, value: torch.Tensor) -> None:
        assert target.shape == value.shape, (target.shape, value.shape)
        target.copy_(value)

    with torch.no_grad():
        for mine, theirs in ((port.word, "word_embeddings"), (port.position, "position_embeddings"),
                             (port.segment, "token_type_embeddings")):
            load(mine.weight, state[f"embeddings.{theirs}.weight"])
        load(port.norm.weight, state["embeddings.LayerNorm.weight"])
        load(port.norm.bias, state["embeddings.LayerNorm.bias"])
        for i, block in enumerate(port.layers):
            hf = f"encoder.layer.{i}."
            order = ("key", "query", "value") if fault == "in_proj_kqv" and i == layer \
                else ("query", "key", "value")
            attention = block.self_attn
            load(attention.in_proj_weight,
                 torch.cat([state[f"{hf}attention.self.{n}.weight"] for n in order]))
            load(attention.in_proj_bias,
                 torch.cat([state[f"{hf}attention.self.{n}.bias"] for n in order]))
            for mine, theirs in ((attention.out_proj, "attention.output.dense"),
                                 (block.linear1, "intermediate.dense"),
                                 (block.linear2, "output.dense"),
                                 (block.norm1, "attention.output.LayerNorm"),
                                 (block.norm2, "output.LayerNorm")):
                load(mine.weight, state[f"{hf}{theirs}.weight"])
                load(mine.bias, state[f"{hf}{theirs}.bias"])
    if fault == "no_padding_mask":
        port.padding_mask = False
    if fault == "position_offset":
        port.position_start = 1
    return port.eval()
