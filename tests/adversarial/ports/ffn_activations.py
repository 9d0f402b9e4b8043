"""A nanoGPT-style BERT encoder (imports only torch): fused QKV, a LayerNorm by hand, the
FFN's activation a function chosen per layer. Builds:

- ``correct``: GELU written out, ``0.5 * x * (1 + erf(x / sqrt(2)))``, in every layer;
- ``relu``, ``silu``, ``quick``: layer 3 takes ReLU, SiLU or QuickGELU
  (``x * sigmoid(1.702 x)``, CLIP's) for GELU.
"""

from __future__ import annotations

import math

import torch
from torch import nn

FAULT_LAYER = 3
ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "relu": torch.relu,
    "silu": lambda x: x * torch.sigmoid(x),
    "quick": lambda x: x * torch.sigmoid(1.702 * x),
}


class Norm(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.g, self.b, self.eps = nn.Parameter(weight.clone()), nn.Parameter(bias.clone()), eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) * torch.rsqrt(var + self.eps) * self.g + self.b


class Block(nn.Module):
    def __init__(self, sd: dict, i: int, config, activation: str) -> None:
        super().__init__()
        p = f"encoder.layer.{i}."
        H = config.hidden_size
        self.n_head = config.num_attention_heads
        self.c_attn = nn.Linear(H, 3 * H)
        self.c_proj = nn.Linear(H, H)
        self.c_fc = nn.Linear(H, config.intermediate_size)
        self.c_out = nn.Linear(config.intermediate_size, H)
        with torch.no_grad():
            self.c_attn.weight.copy_(torch.cat([sd[p + f"attention.self.{n}.weight"]
                                                for n in ("query", "key", "value")]))
            self.c_attn.bias.copy_(torch.cat([sd[p + f"attention.self.{n}.bias"]
                                              for n in ("query", "key", "value")]))
            for mine, theirs in ((self.c_proj, "attention.output.dense"),
                                 (self.c_fc, "intermediate.dense"), (self.c_out, "output.dense")):
                mine.weight.copy_(sd[p + theirs + ".weight"])
                mine.bias.copy_(sd[p + theirs + ".bias"])
        self.ln_1 = Norm(sd[p + "attention.output.LayerNorm.weight"],
                         sd[p + "attention.output.LayerNorm.bias"], config.layer_norm_eps)
        self.ln_2 = Norm(sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"],
                         config.layer_norm_eps)
        self.act = ACTIVATIONS[activation]

    def forward(self, x, bias):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1))) + bias
        y = (att.softmax(dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = self.ln_1(x + self.c_proj(y))
        return self.ln_2(x + self.c_out(self.act(self.c_fc(x))))


class Encoder(nn.Module):
    def __init__(self, reference, fault: str = "gelu") -> None:
        super().__init__()
        sd, config = reference.model.state_dict(), reference.config
        self.wte = nn.Embedding.from_pretrained(sd["embeddings.word_embeddings.weight"].clone(),
                                                freeze=False)
        self.wpe = nn.Parameter(sd["embeddings.position_embeddings.weight"].clone())
        self.wtt = nn.Parameter(sd["embeddings.token_type_embeddings.weight"].clone())
        self.ln_e = Norm(sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"],
                         config.layer_norm_eps)
        self.h = nn.ModuleList(
            Block(sd, i, config, fault if i == FAULT_LAYER else "gelu")
            for i in range(config.num_hidden_layers))
        self.pool = nn.Linear(config.hidden_size, config.hidden_size)
        with torch.no_grad():
            self.pool.weight.copy_(sd["pooler.dense.weight"])
            self.pool.bias.copy_(sd["pooler.dense.bias"])

    def forward(self, input_ids, token_type_ids, attention_mask):
        T = input_ids.shape[1]
        x = self.ln_e(self.wte(input_ids) + self.wpe[:T] + self.wtt[token_type_ids])
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -1e9
        for block in self.h:
            x = block(x, bias)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference):
    return Encoder(reference).eval()


def relu(reference):
    return Encoder(reference, "relu").eval()


def silu(reference):
    return Encoder(reference, "silu").eval()


def quick(reference):
    return Encoder(reference, "quick").eval()
