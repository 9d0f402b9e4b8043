"""A BERT port whose blocks are cut elsewhere than HF's layers (probe round k): its stage i
runs layer i-1's output LayerNorm, then layer i's attention and its LayerNorm, then layer
i's FFN; a tail holds layer 5's output LayerNorm. Every weight is held once, in another
block than HF's. ``correct`` has every eps at 1e-12; ``eps_in_layer_2`` gives HF's
``encoder.layer.2.output.LayerNorm`` (the port's ``stages.3.prev_norm``) eps 1e-5; the
slips of a key map (probe round l): ``key_of_layer_5_from_layer_0``,
``last_norm_of_layer_3_from_layer_2`` (in stage 4)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(n))
        self.shift = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + self.eps) * self.gain \
            + self.shift


class Stage(nn.Module):
    def __init__(self, width, heads, inner, prev_eps):
        super().__init__()
        self.heads = heads
        self.prev_norm = Norm(width, prev_eps) if prev_eps else None
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))
        self.norm_a = Norm(width, 1e-12)
        self.up, self.down = nn.Linear(width, inner), nn.Linear(inner, width)

    def forward(self, x, bias):
        if self.prev_norm is not None:
            x = self.prev_norm(x)
        b, s, w = x.shape
        d = w // self.heads

        def split(t):
            return t.view(b, s, self.heads, d).transpose(1, 2)

        scores = split(self.q(x)) @ split(self.k(x)).transpose(-1, -2) / math.sqrt(d)
        a = torch.softmax(scores + bias, -1)
        x = self.norm_a(x + self.o((a @ split(self.v(x))).transpose(1, 2).reshape(b, s, w)))
        return x + self.down(F.gelu(self.up(x)))


_LINEARS = (("q", "attention.self.query"), ("k", "attention.self.key"),
            ("v", "attention.self.value"), ("o", "attention.output.dense"),
            ("up", "intermediate.dense"), ("down", "output.dense"))


class ShiftedPort(nn.Module):
    def __init__(self, hf, bad_layer):
        super().__init__()
        c, sd, layers = hf.config, hf.state_dict(), hf.config.num_hidden_layers

        def eps(j):
            return 1e-5 if j == bad_layer else 1e-12

        self.tok, self.pos, self.seg = (
            nn.Embedding.from_pretrained(sd[f"embeddings.{k}_embeddings.weight"], freeze=False)
            for k in ("word", "position", "token_type"))
        self.enorm = Norm(c.hidden_size, 1e-12)
        self.stages = nn.ModuleList(
            Stage(c.hidden_size, c.num_attention_heads, c.intermediate_size,
                  eps(i - 1) if i else None) for i in range(layers))
        self.tail = Norm(c.hidden_size, eps(layers - 1))
        self.pool = nn.Linear(c.hidden_size, c.hidden_size)
        with torch.no_grad():
            self._norm(self.enorm, sd, "embeddings.LayerNorm.")
            for i, stage in enumerate(self.stages):
                for mine, theirs in _LINEARS:
                    getattr(stage, mine).weight.copy_(sd[f"encoder.layer.{i}.{theirs}.weight"])
                    getattr(stage, mine).bias.copy_(sd[f"encoder.layer.{i}.{theirs}.bias"])
                self._norm(stage.norm_a, sd, f"encoder.layer.{i}.attention.output.LayerNorm.")
                if i:
                    self._norm(stage.prev_norm, sd, f"encoder.layer.{i - 1}.output.LayerNorm.")
            self._norm(self.tail, sd, f"encoder.layer.{layers - 1}.output.LayerNorm.")
            self.pool.weight.copy_(sd["pooler.dense.weight"])
            self.pool.bias.copy_(sd["pooler.dense.bias"])

    @staticmethod
    def _norm(norm, sd, prefix):
        norm.gain.copy_(sd[prefix + "weight"])
        norm.shift.copy_(sd[prefix + "bias"])

    def forward(self, input_ids, token_type_ids, attention_mask):
        positions = self.pos(torch.arange(input_ids.shape[1]))[None]
        x = self.enorm(self.tok(input_ids) + positions + self.seg(token_type_ids))
        bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for stage in self.stages:
            x = stage(x, bias)
        x = self.tail(x)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def correct(reference):
    return ShiftedPort(reference.model, None).eval()


def eps_in_layer_2(reference):
    return ShiftedPort(reference.model, 2).eval()


def _slipped(reference, stage, part, source):
    """Stage ``stage``'s ``part`` (``k``, or ``prev_norm``) loaded from HF layer
    ``source``."""
    model = ShiftedPort(reference.model, None).eval()
    sd = reference.model.state_dict()
    with torch.no_grad():
        if part == "prev_norm":
            ShiftedPort._norm(model.stages[stage].prev_norm, sd,
                              f"encoder.layer.{source}.output.LayerNorm.")
        else:
            theirs = dict(_LINEARS)[part]
            getattr(model.stages[stage], part).weight.copy_(
                sd[f"encoder.layer.{source}.{theirs}.weight"])
    return model


def key_of_layer_5_from_layer_0(reference):
    return _slipped(reference, 5, "k", 0)


def last_norm_of_layer_3_from_layer_2(reference):
    """(layer 3's last LayerNorm sits in stage 4)"""
    return _slipped(reference, 4, "prev_norm", 2)
