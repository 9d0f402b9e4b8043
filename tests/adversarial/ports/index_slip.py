"""A BERT written plainly (q, k, v, o Linears, two LayerNorms, an FFN; HF's weights
copied in by a key mapping), and the same with an index slip in that mapping: one
projection of a layer loaded from the layer before it (probe round i).

Correct: ``correct``. Faulty: ``value_from_previous``, ``query_from_previous`` (layer 3's
value or query holding layer 2's weights), ``up_from_previous`` (layer 1's FFN up holding
layer 0's)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.nh, self.hd = c.num_attention_heads, H // c.num_attention_heads
        self.q, self.k, self.v, self.o = (nn.Linear(H, H) for _ in range(4))
        self.ln1 = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.up = nn.Linear(H, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, H)
        self.ln2 = nn.LayerNorm(H, eps=c.layer_norm_eps)

    def forward(self, x, mask_add):
        B, S, H = x.shape

        def sp(t):
            return t.view(B, S, self.nh, self.hd).transpose(1, 2)

        q, k, v = sp(self.q(x)), sp(self.k(x)), sp(self.v(x))
        p = (q @ k.transpose(-1, -2) / math.sqrt(self.hd) + mask_add).softmax(-1)
        a = (p @ v).transpose(1, 2).reshape(B, S, H)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c.hidden_size
        self.word = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.typ = nn.Embedding(c.type_vocab_size, H)
        self.ln = nn.LayerNorm(H, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.pool = nn.Linear(H, H)

    def forward(self, input_ids, attention_mask, token_type_ids):
        S = input_ids.shape[1]
        x = self.ln(self.word(input_ids) + self.typ(token_type_ids) + self.pos.weight[:S])
        mask_add = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_add)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


NAMES = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
         "o": "attention.output.dense", "ln1": "attention.output.LayerNorm",
         "up": "intermediate.dense", "down": "output.dense", "ln2": "output.LayerNorm"}
FIXED = {"word": "embeddings.word_embeddings", "pos": "embeddings.position_embeddings",
         "typ": "embeddings.token_type_embeddings", "ln": "embeddings.LayerNorm",
         "pool": "pooler.dense"}


def port(ref):
    sd = ref.state_dict()
    model = Bert(ref.config)
    state = {}
    for name in model.state_dict():
        mod, _, leaf = name.rpartition(".")
        if mod in FIXED:
            state[name] = sd[f"{FIXED[mod]}.{leaf}"].clone()
        else:
            _, i, part = mod.split(".")
            state[name] = sd[f"encoder.layer.{i}.{NAMES[part]}.{leaf}"].clone()
    model.load_state_dict(state)
    return model.eval()


def correct(reference):
    return port(reference)


def _slipped(reference, layer, part):
    model = port(reference)
    with torch.no_grad():
        getattr(model.layers[layer], part).load_state_dict(
            getattr(model.layers[layer - 1], part).state_dict())
    return model


def value_from_previous(reference):
    return _slipped(reference, 3, "v")


def query_from_previous(reference):
    return _slipped(reference, 3, "q")


def up_from_previous(reference):
    return _slipped(reference, 1, "up")
