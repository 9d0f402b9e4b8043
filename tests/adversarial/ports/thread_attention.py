"""BERT as one module with no submodules, each layer's attention computed in a thread of
its own (imports only torch).

The weights are the model's own Parameters (``l1_query_w``); each layer starts a
``threading.Thread`` for its attention and joins it; the rest runs on the caller's
thread. The recording follows only the caller's thread: the attention's outputs enter it
as constants, so fewer than half the reference's weighted nodes paired, and every pair
was thrown away ("another model or size?"), leaving the outputs alone to judge.

- ``correct``: BERT's arithmetic;
- ``faulty``: layer 1's second LayerNorm with eps 1e-5 for 1e-12 (on the caller's thread;
  the outputs move by less than their budget);
- ``correct_all_in_thread``: the whole forward in a worker thread: the recording sees none
  of its weights (probe round o: it was told "another model or size, or not loaded from
  the reference?").
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_PARTS = {"attention.self.query": "query", "attention.self.key": "key",
          "attention.self.value": "value", "attention.output.dense": "mix",
          "attention.output.LayerNorm": "norm1", "intermediate.dense": "up",
          "output.dense": "down", "output.LayerNorm": "norm2"}


class ThreadedBert(nn.Module):
    def __init__(self, reference: Any, eps_slip: bool = False) -> None:
        super().__init__()
        self.config = reference.config
        self.eps_slip = eps_slip
        for key, value in reference.model.state_dict().items():
            if key.endswith("position_ids"):
                continue
            name = "emb_" + key.removeprefix("embeddings.") if key.startswith("embeddings.") \
                else key.replace("pooler.dense.", "pool_")
            if key.startswith("encoder.layer."):
                _, _, number, rest = key.split(".", 3)
                part, leaf = rest.rsplit(".", 1)
                name = f"l{number}_{_PARTS[part]}_{leaf}"
            setattr(self, name.replace(".", "_"), nn.Parameter(value.detach().clone()))

    def get(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    def attention(self, layer: int, x: torch.Tensor, blocked: torch.Tensor,
                  out: list[torch.Tensor], grad: bool) -> None:
        with torch.set_grad_enabled(grad):
            batch, length, width = x.shape
            heads = self.config.num_attention_heads

            def project(part: str) -> torch.Tensor:
                y = F.linear(x, self.get(f"l{layer}_{part}_weight"),
                             self.get(f"l{layer}_{part}_bias"))
                return y.view(batch, length, heads, -1).transpose(1, 2)

            q, k, v = project("query"), project("key"), project("value")
            scores = q @ k.transpose(-1, -2) / math.sqrt(width // heads) + blocked
            mixed = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, width)
            out.append(mixed)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        c = self.config
        length = input_ids.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (self.emb_word_embeddings_weight[input_ids]
             + self.emb_token_type_embeddings_weight[token_type_ids]
             + self.emb_position_embeddings_weight[:length])
        width = x.shape[-1]
        x = F.layer_norm(x, (width,), self.emb_LayerNorm_weight, self.emb_LayerNorm_bias,
                         c.layer_norm_eps)
        blocked = (attention_mask[:, None, None, :] == 0).float() * torch.finfo(x.dtype).min
        for i in range(c.num_hidden_layers):
            found: list[torch.Tensor] = []
            worker = threading.Thread(target=self.attention,
                                      args=(i, x, blocked, found, torch.is_grad_enabled()))
            worker.start()
            worker.join()
            mixed = F.linear(found[0], self.get(f"l{i}_mix_weight"), self.get(f"l{i}_mix_bias"))
            x = F.layer_norm(x + mixed, (width,), self.get(f"l{i}_norm1_weight"),
                             self.get(f"l{i}_norm1_bias"), c.layer_norm_eps)
            up = F.gelu(F.linear(x, self.get(f"l{i}_up_weight"), self.get(f"l{i}_up_bias")))
            down = F.linear(up, self.get(f"l{i}_down_weight"), self.get(f"l{i}_down_bias"))
            eps = 1e-5 if (self.eps_slip and i == 1) else c.layer_norm_eps
            x = F.layer_norm(x + down, (width,), self.get(f"l{i}_norm2_weight"),
                             self.get(f"l{i}_norm2_bias"), eps)
        pooled = torch.tanh(F.linear(x[:, 0], self.pool_weight, self.pool_bias))
        return {"last_hidden_state": x, "pooler_output": pooled}


def correct(reference: Any) -> ThreadedBert:
    return ThreadedBert(reference).eval()


def faulty(reference: Any) -> ThreadedBert:
    return ThreadedBert(reference, eps_slip=True).eval()


class AllInThread(ThreadedBert):
    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        found: dict[str, Any] = {}
        grad = torch.is_grad_enabled()

        def whole() -> None:
            with torch.set_grad_enabled(grad):
                found.update(ThreadedBert.forward(self, input_ids, attention_mask,
                                                  token_type_ids))

        worker = threading.Thread(target=whole)
        worker.start()
        worker.join()
        return found


def correct_all_in_thread(reference: Any) -> AllInThread:
    return AllInThread(reference).eval()
