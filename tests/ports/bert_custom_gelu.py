"""A BERT whose GELU is an op of its own, registered with ``torch.library``.

Imports nothing from introspect; only torch. Many ports call fused kernels from C++ or
CUDA (``load_inline``, a wheel of custom kernels) through ``torch.library``: to PyTorch's
dispatcher such an op is opaque, one call with no ops inside. Here it is
``introspect_ports::gelu`` (defined in Python through ``torch.library.custom_op``, the same
dispatcher entry a C++ ``TORCH_LIBRARY`` makes). Everything else is HF's BERT under its
own names: ``q``, ``k``, ``v``, ``o``, ``ln_attn``, ``ln_ffn``.

bert-tiny as loaded has every LayerNorm at weight 1 and bias 0: weights alone cannot tell
a layer's attention LayerNorm from its FFN LayerNorm.

Faults (``build(reference, fault)``): ``gelu_sigmoid``: the op computes
``x * sigmoid(1.702 x)`` (the "quick" GELU) instead of the exact erf GELU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FAULTS = ("gelu_sigmoid",)


@torch.library.custom_op("introspect_ports::dense_gelu", mutates_args=())
def dense_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               quick: bool) -> torch.Tensor:
    """gelu(x @ weight.T + bias) in one call, as a fused kernel computes it."""
    h = F.linear(x, weight, bias)
    if quick:
        return h * torch.sigmoid(1.702 * h)
    return F.gelu(h)


@dense_gelu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, quick: bool) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _backward(ctx, grad: torch.Tensor):
    """The gradients of the same formula, taken by autograd on a recomputation."""
    x, weight, bias = (t.detach().requires_grad_() for t in ctx.saved_tensors)
    with torch.enable_grad():
        h = F.linear(x, weight, bias)
        y = h * torch.sigmoid(1.702 * h) if ctx.quick else F.gelu(h)
        gx, gw, gb = torch.autograd.grad(y, (x, weight, bias), grad)
    return gx, gw, gb, None


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[:3])
    ctx.quick = inputs[3]


dense_gelu.register_autograd(_backward, setup_context=_setup_context)


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, inner: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.ln_attn = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        self.ln_ffn = nn.LayerNorm(hidden, eps=eps)
        self.quick = False

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        hd = H // self.heads
        q = self.q(x).view(B, S, self.heads, hd).transpose(1, 2)  # (B, nh, S, hd)
        k = self.k(x).view(B, S, self.heads, hd).transpose(1, 2)
        v = self.v(x).view(B, S, self.heads, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.ln_attn(x + self.o(y.transpose(1, 2).reshape(B, S, H)))
        return self.ln_ffn(x + self.down(dense_gelu(x, self.up.weight, self.up.bias, self.quick)))


class Bert(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        H = config.hidden_size
        self.words = nn.Embedding(config.vocab_size, H)
        self.positions = nn.Embedding(config.max_position_embeddings, H)
        self.segments = nn.Embedding(config.type_vocab_size, H)
        self.ln_embed = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(
            Layer(H, config.num_attention_heads, config.intermediate_size, config.layer_norm_eps)
            for _ in range(config.num_hidden_layers))
        self.pool = nn.Linear(H, H)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        S = input_ids.shape[1]
        x = self.words(input_ids) + self.segments(token_type_ids) \
            + self.positions(torch.arange(S)[None])
        x = self.ln_embed(x)
        bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for layer in self.layers:
            x = layer(x, bias)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def build(reference: nn.Module, fault: str | None = None, layer: int = 0) -> nn.Module:
    """The port holding an HF ``BertModel``'s weights, ``fault`` in layer ``layer``."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    model = Bert(reference.config)
    keys = {"words.weight": "embeddings.word_embeddings.weight",
            "positions.weight": "embeddings.position_embeddings.weight",
            "segments.weight": "embeddings.token_type_embeddings.weight",
            "ln_embed.weight": "embeddings.LayerNorm.weight",
            "ln_embed.bias": "embeddings.LayerNorm.bias",
            "pool.weight": "pooler.dense.weight", "pool.bias": "pooler.dense.bias"}
    theirs = {"q": "attention.self.query", "k": "attention.self.key",
              "v": "attention.self.value", "o": "attention.output.dense",
              "ln_attn": "attention.output.LayerNorm", "up": "intermediate.dense",
              "down": "output.dense", "ln_ffn": "output.LayerNorm"}
    for i in range(len(model.layers)):
        for mine, hf in theirs.items():
            for p in ("weight", "bias"):
                keys[f"layers.{i}.{mine}.{p}"] = f"encoder.layer.{i}.{hf}.{p}"
    state = reference.state_dict()
    with torch.no_grad():
        for key, target in model.state_dict().items():
            w = state[keys[key]]
            assert w.shape == target.shape, (key, tuple(w.shape), tuple(target.shape))
            target.copy_(w)
    if fault == "gelu_sigmoid":
        model.layers[layer].quick = True
    return model.eval()
