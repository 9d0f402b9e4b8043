"""A small BERT port for the backward tests, with one training bug switched on at a time.

Written for these tests in its own hand: it imports only torch, copies HF's weights into
its own flat parameters, and runs attention by hand (HF runs sdpa). Every bug of
``BUGS`` leaves the forward as it is (up to rounding) and changes only the backward,
except ``dropout`` and ``padded_loss``, which change both, as they do in real ports:

- ``custom_gelu``: GELU as an ``autograd.Function`` whose backward forgets the
  ``x * pdf(x)`` term (encoder layer ``layer``'s intermediate activation);
- ``detach``: the attention output detached before the residual add (layer ``layer``);
- ``inplace``: the attention probabilities zeroed through ``.data`` after they were used,
  so autograd's saved copy is wrong and its version counter never knew;
- ``scaled_hook``: a gradient hook that multiplies by 8 (loss scaling never undone);
- ``untied``: the MLM decoder holds a copy of the word embeddings, not the same tensor;
- ``padded_loss``: the model's own MLM loss counts every position, -100 labels included;
- ``dropout``: dropout on the attention probabilities left on (training=True);
- ``no_padding_idx``: the word embedding looked up without ``padding_idx``, so the pad
  token's row gets a gradient (HF's never does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

BUGS = ("custom_gelu", "detach", "inplace", "scaled_hook", "untied", "padded_loss", "dropout",
        "no_padding_idx")


class _WrongGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))  # x * pdf(x) forgotten


class SmallBert(nn.Module):
    """bert(input_ids, token_type_ids, attention_mask[, labels]) -> (hidden | logits, ...)."""

    def __init__(self, hf: nn.Module, bug: str | None = None, layer: int = 0) -> None:
        super().__init__()
        if bug is not None and bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r}")
        self.bug, self.bug_layer = bug, layer
        body = getattr(hf, "bert", hf)
        c = body.config
        self.heads, self.eps, self.layers = c.num_attention_heads, c.layer_norm_eps, \
            c.num_hidden_layers
        self.pad_token = c.pad_token_id
        self.head = "mlm" if hasattr(hf, "cls") else \
            "classifier" if hasattr(hf, "classifier") else "base"
        state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        prefix = "bert." if hasattr(hf, "bert") else ""
        self.p = nn.ParameterDict()
        for key, value in state.items():
            if key.startswith(prefix) and "position_ids" not in key:
                self.p[key[len(prefix):].replace(".", "__")] = nn.Parameter(value)
        if self.head == "mlm":
            for key in ("transform.dense.weight", "transform.dense.bias",
                        "transform.LayerNorm.weight", "transform.LayerNorm.bias", "bias"):
                self.p["mlm__" + key.replace(".", "__")] = nn.Parameter(
                    state["cls.predictions." + key])
            if bug == "untied":
                self.decoder = nn.Parameter(state[prefix + "embeddings.word_embeddings.weight"])
        elif self.head == "classifier":
            self.p["cls__weight"] = nn.Parameter(state["classifier.weight"])
            self.p["cls__bias"] = nn.Parameter(state["classifier.bias"])

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "__")]

    def ln(self, x, prefix):
        return F.layer_norm(x, x.shape[-1:], self.w(prefix + ".weight"), self.w(prefix + ".bias"),
                            self.eps)

    def lin(self, x, prefix):
        return F.linear(x, self.w(prefix + ".weight"), self.w(prefix + ".bias"))

    def attention(self, x, keep, i):
        B, S, H = x.shape
        nh = self.heads
        hd = H // nh
        pre = f"encoder.layer.{i}.attention.self."
        q = self.lin(x, pre + "query").view(B, S, nh, hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.lin(x, pre + "key").view(B, S, nh, hd).transpose(1, 2)
        v = self.lin(x, pre + "value").view(B, S, nh, hd).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)  # (B, nh, S, S)
        scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)
        if self.bug == "dropout" and i == self.bug_layer:
            probs = F.dropout(probs, p=0.1, training=True)
        ctx = probs @ v  # (B, nh, S, hd)
        if self.bug == "inplace" and i == self.bug_layer:
            probs.data.zero_()  # after use: the forward is done; autograd's saved probs not
        return ctx.transpose(1, 2).reshape(B, S, H)

    def layer(self, x, keep, i):
        pre = f"encoder.layer.{i}."
        a = self.lin(self.attention(x, keep, i), pre + "attention.output.dense")
        if self.bug == "detach" and i == self.bug_layer:
            a = a.detach()
        x = self.ln(x + a, pre + "attention.output.LayerNorm")
        h = self.lin(x, pre + "intermediate.dense")
        h = _WrongGelu.apply(h) if self.bug == "custom_gelu" and i == self.bug_layer \
            else F.gelu(h)
        if self.bug == "scaled_hook" and i == self.bug_layer and h.requires_grad:
            h.register_hook(lambda g: g * 8.0)
        return self.ln(x + self.lin(h, pre + "output.dense"), pre + "output.LayerNorm")

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        S = input_ids.shape[1]
        pad = None if self.bug == "no_padding_idx" else self.pad_token
        x = F.embedding(input_ids, self.w("embeddings.word_embeddings.weight"), pad) \
            + F.embedding(token_type_ids, self.w("embeddings.token_type_embeddings.weight")) \
            + self.w("embeddings.position_embeddings.weight")[:S]
        x = self.ln(x, "embeddings.LayerNorm")
        keep = attention_mask.bool()  # (B, S)
        for i in range(self.layers):
            x = self.layer(x, keep, i)
        if self.head == "classifier":
            pooled = torch.tanh(self.lin(x[:, 0], "pooler.dense"))
            return (F.linear(pooled, self.w("cls.weight"), self.w("cls.bias")),)
        if self.head == "base":
            return (x,)
        t = self.ln(F.gelu(self.lin(x, "mlm.transform.dense")), "mlm.transform.LayerNorm")
        decoder = self.decoder if self.bug == "untied" else \
            self.w("embeddings.word_embeddings.weight")
        logits = F.linear(t, decoder, self.w("mlm.bias"))
        if labels is None:
            return (logits,)
        flat = logits.reshape(-1, logits.shape[-1])
        if self.bug == "padded_loss":  # every position counts: -100 turned into token 0
            loss = F.cross_entropy(flat, labels.reshape(-1).clamp(min=0))
        else:
            loss = F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100)
        return (loss, logits)


def build(reference: nn.Module, bug: str | None = None, layer: int = 0) -> SmallBert:
    return SmallBert(reference, bug, layer).eval()
