"""A Llama cut into pipeline stages at other places than HF's layers (probe round l): stage
0 is layer 0's attention; stage i is layer i-1's MLP, then layer i's attention; a tail
holds the last layer's MLP. Each part returns the residual sum, which HF computes between
its modules (the post-attention residual is no module's output). The parts are those of
``llama_key_map.py`` (Meta's names).

``correct``; ``ffn_norm_eps_in_layer`` (layer ``n``'s MLP RMSNorm with eps 1e-3, in stage
``n + 1``)."""

import torch
from llama_key_map import KEYS, Attention, FeedForward, RMSNorm, keep_rope_table
from torch import nn


class AttentionPart(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config.hidden_size, config.num_attention_heads,
                              config.num_key_value_heads)

    def forward(self, x, cos, sin):
        return x + self.attn(self.attn_norm(x), cos, sin)


class MlpPart(nn.Module):
    def __init__(self, config, eps=None):
        super().__init__()
        self.ffn_norm = RMSNorm(config.hidden_size, eps or config.rms_norm_eps)
        self.ffn = FeedForward(config.hidden_size, config.intermediate_size)

    def forward(self, x):
        return x + self.ffn(self.ffn_norm(x))


class Stage(nn.Module):
    def __init__(self, config, mlp):
        super().__init__()
        self.mlp = mlp
        self.attention = AttentionPart(config)

    def forward(self, x, cos, sin):
        if self.mlp is not None:
            x = self.mlp(x)
        return self.attention(x, cos, sin)


class StagedLlama(nn.Module):
    def __init__(self, config, eps_layer=None):
        super().__init__()
        layers = config.num_hidden_layers

        def mlp(layer):
            return MlpPart(config, 1e-3 if layer == eps_layer else None)

        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.stages = nn.ModuleList(Stage(config, mlp(i - 1) if i else None)
                                    for i in range(layers))
        self.tail = mlp(layers - 1)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        keep_rope_table(self, config)

    def forward(self, input_ids, attention_mask=None):
        t = input_ids.shape[1]
        x = self.tok_embeddings(input_ids)
        for stage in self.stages:
            x = stage(x, self.cos[:t], self.sin[:t])
        return {"last_hidden_state": self.norm(self.tail(x))}


def _load(reference, eps_layer=None):
    state = reference.state_dict()
    model = StagedLlama(reference.config, eps_layer)
    layers = reference.config.num_hidden_layers
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(state["embed_tokens.weight"])
        model.norm.weight.copy_(state["norm.weight"])
        for i in range(layers):
            attention = model.stages[i].attention
            mlp = model.stages[i + 1].mlp if i + 1 < layers else model.tail
            for mine, theirs in KEYS.items():
                part = attention if mine.startswith("attn") else mlp
                part.get_submodule(mine).weight.copy_(state[f"layers.{i}.{theirs}.weight"])
    return model.eval()


def correct(reference):
    return _load(reference)


def ffn_norm_eps_in_layer(reference, n):
    return _load(reference, eps_layer=n)
