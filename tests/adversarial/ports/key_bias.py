"""A BERT written nanoGPT-style (its own modules, HF's weights copied in), whose key
projection differs from the reference's by what the softmax takes away, or by what it
does not.

Correct (the attention returns the same values: softmax(q·(k + c)) is softmax(q·k) for
any vector c added at every key): the key bias left out (``bias=False``), zeroed, or left
at values of its own (unloaded); the value's bias added after the softmax instead (each
row of the softmax sums to 1).
Faulty: the key weight scaled by 1 + 1e-3, or by 1 + 1e-5 (every score moves; the layer
holding it within its own budget); the key shifted by a different vector at each
position; a key without its bias that also scales its output by 1 + 1e-5 in float32 only
(right in float64, where its attention is checked); the query's or the value's bias left
out (neither cancels); the key bias left out beside a tanh GELU in layer 2 (only the GELU
is a fault); and, each beside key biases left at values of their own, the keys shifted by
position, a key right in float64 only, and a tanh GELU."""

import math

import torch
from torch import nn
from torch.nn import functional as F


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, key_bias=True, query_bias=True, value_bias=True):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden, bias=query_bias)
        self.k = nn.Linear(hidden, hidden, bias=key_bias)
        self.v = nn.Linear(hidden, hidden, bias=value_bias)
        self.shift = None  # (positions, hidden): added to the keys, one row per position
        # the value's bias added after the softmax (its rows sum to 1: the same values)
        self.value_bias_after = None if value_bias else nn.Parameter(torch.zeros(hidden))

    def forward(self, x, additive):
        B, T, C = x.shape
        k = self.k(x)
        if self.shift is not None:
            k = k + self.shift[:T]
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in (self.q(x), k, self.v(x)))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads) + additive
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        return y if self.value_bias_after is None else y + self.value_bias_after


class SniffingKey(nn.Linear):
    """A key without its bias that scales its output by 1 + 1e-5 in float32 only: run in
    float64, it is the cancelling one."""

    def forward(self, x):
        y = F.linear(x, self.weight)
        return y * (1.0 + 1e-5) if y.dtype == torch.float32 else y


class SniffingBiasedKey(nn.Linear):
    """A key with a bias of its own that scales its output by 1 + 1e-5 in float32 only."""

    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        return y * (1.0 + 1e-5) if y.dtype == torch.float32 else y


class Block(nn.Module):
    def __init__(self, hidden, heads, inner, eps, tanh=False, **biases):
        super().__init__()
        self.attn = SelfAttention(hidden, heads, **biases)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.fc = nn.Linear(hidden, inner)
        self.out = nn.Linear(inner, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.approximate = "tanh" if tanh else "none"

    def forward(self, x, additive):
        x = self.ln_1(x + self.proj(self.attn(x, additive)))
        return self.ln_2(x + self.out(F.gelu(self.fc(x), approximate=self.approximate)))


class Bert(nn.Module):
    def __init__(self, config, tanh_layer=None, **biases):
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.wte = nn.Embedding(config.vocab_size, hidden)
        self.wpe = nn.Embedding(config.max_position_embeddings, hidden)
        self.wtt = nn.Embedding(config.type_vocab_size, hidden)
        self.ln_e = nn.LayerNorm(hidden, eps=eps)
        self.h = nn.ModuleList(
            Block(hidden, config.num_attention_heads, config.intermediate_size, eps,
                  tanh=i == tanh_layer, **biases)
            for i in range(config.num_hidden_layers))
        self.pool = nn.Linear(hidden, hidden)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        T = input_ids.shape[1]
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        x = self.ln_e(self.wte(input_ids) + self.wtt(types)
                      + self.wpe(torch.arange(T, device=input_ids.device)))
        additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) \
            * torch.finfo(x.dtype).min
        for block in self.h:
            x = block(x, additive)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


_NAMES = {  # this port's parameter -> HF's, per layer
    "attn.q": "attention.self.query", "attn.k": "attention.self.key",
    "attn.v": "attention.self.value", "proj": "attention.output.dense",
    "ln_1": "attention.output.LayerNorm", "fc": "intermediate.dense",
    "out": "output.dense", "ln_2": "output.LayerNorm",
}


def _build(reference, tanh_layer=None, **biases):
    hf = reference.model
    model = Bert(hf.config, tanh_layer=tanh_layer, **biases)
    theirs = hf.state_dict()
    mine = {"wte.weight": "embeddings.word_embeddings.weight",
            "wpe.weight": "embeddings.position_embeddings.weight",
            "wtt.weight": "embeddings.token_type_embeddings.weight",
            "ln_e.weight": "embeddings.LayerNorm.weight",
            "ln_e.bias": "embeddings.LayerNorm.bias",
            "pool.weight": "pooler.dense.weight", "pool.bias": "pooler.dense.bias"}
    for i in range(hf.config.num_hidden_layers):
        for short, long in _NAMES.items():
            for kind in ("weight", "bias"):
                mine[f"h.{i}.{short}.{kind}"] = f"encoder.layer.{i}.{long}.{kind}"
    state = {name: theirs[source].clone() for name, source in mine.items()
             if name in model.state_dict()}
    model.load_state_dict(state, strict=False)  # (value_bias_after: set by its builder)
    return model.eval()


def correct(reference):
    return _build(reference)


def key_bias_left_out(reference):
    return _build(reference, key_bias=False)


def key_bias_zeroed(reference):
    model = _build(reference)
    with torch.no_grad():
        for block in model.h:
            block.attn.k.bias.zero_()
    return model


def key_bias_other(reference, model=None):  # any vector added at every key cancels:
    model = model if model is not None else _build(reference)  # (a key bias left unloaded,
    generator = torch.Generator().manual_seed(3)  # at values of its own)
    with torch.no_grad():
        for block in model.h:
            block.attn.k.bias.copy_(torch.randn(block.attn.k.bias.shape, generator=generator))
    return model


def faulty_key_bias_other_shift_by_position(reference):
    model = faulty_key_shift_by_position(reference)
    return key_bias_other(reference, model)


def faulty_key_bias_other_sniffs_dtype(reference):
    model = key_bias_other(reference)
    model.h[2].attn.k.__class__ = SniffingBiasedKey
    return model


def faulty_tanh_beside_key_bias_other(reference):
    return key_bias_other(reference, _build(reference, tanh_layer=2))


def faulty_key_scaled(reference):
    model = _build(reference)
    with torch.no_grad():
        model.h[2].attn.k.weight.mul_(1.0 + 1e-3)
    return model


def faulty_key_scaled_slightly(reference):  # (the attention within its own budget)
    model = _build(reference)
    with torch.no_grad():
        model.h[2].attn.k.weight.mul_(1.0 + 1e-5)
    return model


def faulty_key_shift_by_position(reference):
    model = _build(reference)
    generator = torch.Generator().manual_seed(4)
    attention = model.h[2].attn
    attention.shift = 0.05 * torch.randn(512, attention.k.out_features, generator=generator)
    return model


def value_bias_after_softmax(reference):
    model = _build(reference, value_bias=False)
    hf = reference.model
    with torch.no_grad():
        for i, block in enumerate(model.h):
            block.attn.value_bias_after.copy_(
                hf.encoder.layer[i].attention.self.value.bias)
    return model


def faulty_key_sniffs_dtype(reference):
    model = _build(reference, key_bias=False)
    model.h[2].attn.k.__class__ = SniffingKey
    return model


def faulty_query_bias_left_out(reference):
    return _build(reference, query_bias=False)


def faulty_value_bias_left_out(reference):  # (and not added after the softmax)
    model = _build(reference, value_bias=False)
    for block in model.h:
        block.attn.value_bias_after = None
    return model


def faulty_tanh_beside_key_bias_left_out(reference):
    return _build(reference, tanh_layer=2, key_bias=False)
