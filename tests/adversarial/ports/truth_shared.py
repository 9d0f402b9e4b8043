"""Two ports built from one shared module, the reference and the candidate (imports only
torch). Diffed as ``--reference truth_shared.py:reference --candidate
truth_shared.py:faulty_*``: the file is one module, so a global the candidate's build
changes is changed for the reference too.

- ``faulty_global``: sets the module global ``EPS`` (LayerNorm eps) to 1e-2;
- ``faulty_class_attr``: sets ``SharedBlock.scale_ffn`` to 1.01;
- ``faulty_class_method``: replaces ``SharedBlock.activation`` with the tanh GELU;
- ``correct``: builds a second copy and changes nothing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-12


class SharedBlock(nn.Module):
    scale_ffn = 1.0

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.n1_w, self.n1_b = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.zeros(hidden))
        self.n2_w, self.n2_b = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.zeros(hidden))

    def activation(self, h):
        return F.gelu(h)

    def forward(self, x, mask):
        B, S, H = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(H // self.heads)  # (B, nh, S, S)
        scores = scores + (1.0 - mask[:, None, None, :].float()) * -1e9
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)
        x = F.layer_norm(x + self.proj(y), (H,), self.n1_w, self.n1_b, EPS)
        h = self.down(self.activation(self.up(x))) * self.scale_ffn
        return F.layer_norm(x + h, (H,), self.n2_w, self.n2_b, EPS)


class SharedBert(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        H = c.hidden_size
        self.tok = nn.Embedding(c.vocab_size, H)
        self.pos = nn.Embedding(c.max_position_embeddings, H)
        self.seg = nn.Embedding(c.type_vocab_size, H)
        self.n_w, self.n_b = nn.Parameter(torch.ones(H)), nn.Parameter(torch.zeros(H))
        self.blocks = nn.ModuleList(SharedBlock(H, c.num_attention_heads, c.intermediate_size)
                                    for _ in range(c.num_hidden_layers))

    def forward(self, input_ids, token_type_ids, attention_mask):
        S = input_ids.shape[1]
        x = self.tok(input_ids) + self.seg(token_type_ids) + self.pos(torch.arange(S))
        x = F.layer_norm(x, (x.shape[-1],), self.n_w, self.n_b, EPS)
        for block in self.blocks:
            x = block(x, attention_mask)
        return {"last_hidden_state": x}


def reference(loaded):
    w = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
    model = SharedBert(loaded.config)
    state = {"tok.weight": w["embeddings.word_embeddings.weight"],
             "pos.weight": w["embeddings.position_embeddings.weight"],
             "seg.weight": w["embeddings.token_type_embeddings.weight"],
             "n_w": w["embeddings.LayerNorm.weight"], "n_b": w["embeddings.LayerNorm.bias"]}
    for i in range(loaded.config.num_hidden_layers):
        hf, me = f"encoder.layer.{i}.", f"blocks.{i}."
        for leaf in ("weight", "bias"):
            state[f"{me}qkv.{leaf}"] = torch.cat(
                [w[f"{hf}attention.self.{n}.{leaf}"] for n in ("query", "key", "value")])
            state[f"{me}proj.{leaf}"] = w[f"{hf}attention.output.dense.{leaf}"]
            state[f"{me}up.{leaf}"] = w[f"{hf}intermediate.dense.{leaf}"]
            state[f"{me}down.{leaf}"] = w[f"{hf}output.dense.{leaf}"]
        state[f"{me}n1_w"] = w[f"{hf}attention.output.LayerNorm.weight"]
        state[f"{me}n1_b"] = w[f"{hf}attention.output.LayerNorm.bias"]
        state[f"{me}n2_w"] = w[f"{hf}output.LayerNorm.weight"]
        state[f"{me}n2_b"] = w[f"{hf}output.LayerNorm.bias"]
    model.load_state_dict(state)
    return model.eval()


def correct(loaded):
    return reference(loaded)


def faulty_global(loaded):
    global EPS
    EPS = 1e-2
    return reference(loaded)


def faulty_class_attr(loaded):
    SharedBlock.scale_ffn = 1.01
    return reference(loaded)


def faulty_class_method(loaded):
    SharedBlock.activation = lambda self, h: F.gelu(h, approximate="tanh")
    return reference(loaded)
