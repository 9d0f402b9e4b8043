"""A BERT that trains with activation checkpointing, as memory-bound training code does.

Imports nothing from introspect; only torch. Each encoder layer runs under
``torch.utils.checkpoint.checkpoint``: with ``use_reentrant=True`` (the old default, a
``torch.autograd.Function`` that runs the layer under ``no_grad`` and again in the
backward) or ``use_reentrant=False`` (saved-tensor hooks). The forward and every gradient
are HF's; only when the gradients are made differs. Modules carry HF's names, so the
weights load as they are (``load_state_dict``).

``build(reference, reentrant=True, fault=None, layer=1)``; faults, in layer ``layer``'s
checkpointed region: ``gelu_tanh_big`` (the intermediate activation ``tanh`` instead of
GELU, seen in forward and backward), ``grad_scaled`` (the intermediate output's gradient
scaled by 3 through a hook of the region: the forward holds, the backward does not),
``gelu_backward_tanh`` (the GELU an ``autograd.Function`` whose forward is exact and whose
backward is the tanh approximation's derivative). ``gelu_function``: that Function with
the exact derivative, a correct port.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

FAULTS = ("gelu_tanh_big", "grad_scaled", "gelu_backward_tanh")


class SelfAttention(nn.Module):
    def __init__(self, H: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        hd = H // self.heads
        q = self.query(x).view(B, S, self.heads, hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.key(x).view(B, S, self.heads, hd).transpose(1, 2)
        v = self.value(x).view(B, S, self.heads, hd).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
        return (p @ v).transpose(1, 2).reshape(B, S, H)


class Output(nn.Module):
    def __init__(self, inner: int, H: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(inner, H)
        self.LayerNorm = nn.LayerNorm(H, eps=eps)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + x)


class Attention(nn.Module):
    def __init__(self, H: int, heads: int, eps: float) -> None:
        super().__init__()
        self.self = SelfAttention(H, heads)
        self.output = Output(H, H, eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, bias), x)


class _Gelu(torch.autograd.Function):
    """GELU with its derivative written by hand (``tanh``: the tanh approximation's)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tanh: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.tanh = tanh
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        if ctx.tanh:
            c = math.sqrt(2.0 / math.pi)
            t = torch.tanh(c * (x + 0.044715 * x ** 3))
            slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
        else:
            slope = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) \
                + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad * slope, None


class Intermediate(nn.Module):
    def __init__(self, H: int, inner: int) -> None:
        super().__init__()
        self.dense = nn.Linear(H, inner)
        self.fault = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dense(x)
        if self.fault == "gelu_tanh_big":
            return torch.tanh(h)
        if self.fault in ("gelu_backward_tanh", "gelu_function"):
            return _Gelu.apply(h, self.fault == "gelu_backward_tanh")
        out = F.gelu(h)
        if self.fault == "grad_scaled" and out.requires_grad:
            out.register_hook(lambda g: g * 3.0)
        return out


class Layer(nn.Module):
    def __init__(self, H: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.attention = Attention(H, heads, eps)
        self.intermediate = Intermediate(H, inner)
        self.output = Output(inner, H, eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class Embeddings(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, H,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, H)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1])[None]  # (1, S)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) \
            + self.position_embeddings(positions)
        return self.LayerNorm(x)


class Encoder(nn.Module):
    def __init__(self, config, reentrant: bool) -> None:
        super().__init__()
        self.layer = nn.ModuleList(
            Layer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                  config.layer_norm_eps) for _ in range(config.num_hidden_layers))
        self.reentrant = reentrant
        self.always = False  # checkpointed under no_grad too (``build(always=True)``)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            if torch.is_grad_enabled() or self.always:  # training: recompute each layer
                x = checkpoint(layer, x, bias, use_reentrant=self.reentrant)
            else:
                x = layer(x, bias)
        return x


class Pooler(nn.Module):
    def __init__(self, H: int) -> None:
        super().__init__()
        self.dense = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x[:, 0]))


class CheckpointedBert(nn.Module):
    def __init__(self, config, reentrant: bool) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config, reentrant)
        self.pooler = Pooler(config.hidden_size)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.embeddings(input_ids, token_type_ids)
        bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        x = self.encoder(x, bias)
        return {"last_hidden_state": x, "pooler_output": self.pooler(x)}


def build(reference: nn.Module, reentrant: bool = True, fault: str | None = None,
          layer: int = 1, always: bool = False) -> nn.Module:
    """The port holding an HF ``BertModel``'s weights, ``fault`` in layer ``layer``;
    ``always``: its layers checkpointed under ``no_grad`` too, as some training code does."""
    if fault is not None and fault not in (*FAULTS, "gelu_function"):
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    model = CheckpointedBert(reference.config, reentrant)
    state = {k: v for k, v in reference.state_dict().items() if "position_ids" not in k
             and "token_type_ids" not in k}
    model.load_state_dict(state)
    if fault is not None:
        model.encoder.layer[layer].intermediate.fault = fault
    model.encoder.always = always
    return model.eval()
