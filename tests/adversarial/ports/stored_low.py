"""A BERT encoder that keeps its parameters in a 16-bit dtype to halve their memory and
casts each one up to float32 where it is read (imports only torch): it computes in
float32, but every weight was rounded once. Builds: ``bf16``, ``fp16`` and ``fp32`` (the
same code, parameters kept in float32: a correct port).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Stored(nn.Module):
    def __init__(self, reference, dtype: torch.dtype) -> None:
        super().__init__()
        self.params = nn.ParameterDict({
            key.replace(".", "__"): nn.Parameter(value.detach().to(dtype).clone(),
                                                 requires_grad=False)
            for key, value in reference.model.state_dict().items()
            if value.is_floating_point()})
        config = reference.config
        self.heads, self.eps, self.layers = (config.num_attention_heads, config.layer_norm_eps,
                                             config.num_hidden_layers)
        self.embedded = nn.Identity()  # the embeddings' output passes here (a hook's place)

    def p(self, key: str) -> torch.Tensor:
        return self.params[key.replace(".", "__")].float()

    def forward(self, input_ids, token_type_ids, attention_mask):
        B, S = input_ids.shape
        x = F.embedding(input_ids, self.p("embeddings.word_embeddings.weight")) \
            + F.embedding(token_type_ids, self.p("embeddings.token_type_embeddings.weight")) \
            + self.p("embeddings.position_embeddings.weight")[:S]
        H = x.shape[-1]
        x = self.embedded(F.layer_norm(x, (H,), self.p("embeddings.LayerNorm.weight"),
                                       self.p("embeddings.LayerNorm.bias"), self.eps))
        d = H // self.heads
        add = (1.0 - attention_mask[:, None, None, :].float()) * -1e9
        for i in range(self.layers):
            def lin(name, t, i=i):
                return F.linear(t, self.p(f"encoder.layer.{i}.{name}.weight"),
                                self.p(f"encoder.layer.{i}.{name}.bias"))

            def norm(name, t, i=i):
                return F.layer_norm(t, (H,), self.p(f"encoder.layer.{i}.{name}.weight"),
                                    self.p(f"encoder.layer.{i}.{name}.bias"), self.eps)

            q, k, v = (lin(f"attention.self.{n}", x).view(B, S, self.heads, d).transpose(1, 2)
                       for n in ("query", "key", "value"))
            probs = (q @ k.transpose(-1, -2) / math.sqrt(d) + add).softmax(-1)
            context = (probs @ v).transpose(1, 2).reshape(B, S, H)
            x = norm("attention.output.LayerNorm", lin("attention.output.dense", context) + x)
            x = norm("output.LayerNorm",
                     lin("output.dense", F.gelu(lin("intermediate.dense", x))) + x)
        pooled = torch.tanh(F.linear(x[:, 0], self.p("pooler.dense.weight"),
                                     self.p("pooler.dense.bias")))
        return {"last_hidden_state": x, "pooler_output": pooled}


def fp32(reference):
    return Stored(reference, torch.float32).eval()


def bf16(reference):
    return Stored(reference, torch.bfloat16).eval()


def fp16(reference):
    return Stored(reference, torch.float16).eval()
