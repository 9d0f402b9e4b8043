"""A modular BERT (base model) for the own-backward tests, with one training bug at a time.

Written for these tests in its own hand: it imports only torch, and holds HF's weights in
modules of its own names (``blocks.N.attn.q``, ``blocks.N.ffn.up``, ``norm1``, ...), each
an ``nn.Linear`` or ``nn.LayerNorm`` as people write them, so that module evidence pairs
its modules and every weight is held whole. Attention is by hand (HF runs sdpa).

Every bug leaves the forward as it is (up to rounding) and changes only the backward, each
by another route a real port takes:

- ``gelu_backward``: GELU as an ``autograd.Function`` whose backward forgets the
  ``x * pdf(x)`` term (a module of block ``layer``);
- ``global_switch``: the same, chosen by a module global read in the backward;
- ``closure_scale``: the FFN's output gradient scaled by 1.01 in a hook made by a closure;
- ``backward_hook``: a full backward hook on block ``layer``'s attention that scales the
  gradient it hands back by a private attribute (``_grad_scale`` 1.01);
- ``detach``: the attention output detached before the residual add;
- ``data_inplace``: the attention probabilities zeroed through ``.data`` after use, so
  the copy autograd saved is wrong and its version counter never knew;
- ``class_patch``: ``FeedForward.backward_scale`` patched on the class after the build
  (read by a custom ``Function`` of every block);
- ``first_backward``: GELU's backward without the ``x * pdf(x)`` term on the first
  backward it runs only (a count on its ``Function``: state a lazy init leaves behind);
- ``output_detach``: block ``layer`` returns its output detached (no gradient reaches it
  or anything before it);
- ``output_hook``: block ``layer`` puts a tensor hook on its own output, inside its
  forward, that scales the gradient by 1.05 (a loss scale applied in one layer);
- ``output_hook_inplace``: the same hook, scaling the gradient in place (``g.mul_``)
  and returning nothing;
- ``loop_detach``: the model's loop detaches block ``layer``'s output before the next
  block takes it;
- ``embed_checkpoint``: the embeddings run under ``torch.utils.checkpoint`` with
  ``use_reentrant=True``: with only token ids for inputs, none requires a gradient, and
  the reentrant checkpoint hands back a value autograd does not track (the embeddings
  never train).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

BUGS = ("gelu_backward", "global_switch", "closure_scale", "backward_hook", "detach",
        "data_inplace", "class_patch", "first_backward", "output_detach", "output_hook",
        "output_hook_inplace", "loop_detach", "embed_checkpoint")

EXACT_GELU_BACKWARD = True  # read by ``_SwitchedGelu.backward`` (``global_switch``)


def _gelu_slope(x: torch.Tensor, whole: bool = True) -> torch.Tensor:
    """d gelu(x) / dx = cdf(x) + x * pdf(x); without ``whole``, the ``x * pdf(x)`` term
    forgotten (the bug)."""
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if not whole:
        return cdf
    return cdf + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


class _GeluFunction(torch.autograd.Function):
    """GELU forward bit for bit as ``F.gelu``; each subclass its own backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)


class _HalfGelu(_GeluFunction):
    """The backward without the ``x * pdf(x)`` term."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * _gelu_slope(x, whole=False)


class _SwitchedGelu(_GeluFunction):
    """The backward whole only while ``EXACT_GELU_BACKWARD`` holds."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * _gelu_slope(x, whole=EXACT_GELU_BACKWARD)


class _FirstWrong(_GeluFunction):
    """Its first backward forgets ``x * pdf(x)`` (a count on the class)."""

    backwards = 0

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        _FirstWrong.backwards += 1
        return grad * _gelu_slope(x, whole=_FirstWrong.backwards > 1)


class _Scaled(torch.autograd.Function):
    """The identity forward; the backward times ``FeedForward.backward_scale``."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * FeedForward.backward_scale


class Gelu(nn.Module):
    def __init__(self, how: str = "") -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "gelu_backward":
            return _HalfGelu.apply(x)
        if self.how == "global_switch":
            return _SwitchedGelu.apply(x)
        if self.how == "first_backward":
            return _FirstWrong.apply(x)
        return F.gelu(x)


def _scaling_hook(scale: float):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad * scale
    return hook


class FeedForward(nn.Module):
    backward_scale = 1.0  # ``class_patch`` sets it after the build

    def __init__(self, dim: int, inner: int, eps: float, bug: str = "") -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, inner), nn.Linear(inner, dim)
        self.act = Gelu(bug)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(self.act(self.up(x)))
        if self.bug == "closure_scale" and h.requires_grad:
            h.register_hook(_scaling_hook(1.01))
        if self.bug == "class_patch":
            h = _Scaled.apply(h)
        return self.norm(h + x)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float, bug: str = "") -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.bug = bug
        self._grad_scale = 1.01
        if bug == "backward_hook":
            self.out.register_full_backward_hook(self._scaled)

    def _scaled(self, module, grad_input, grad_output):
        return tuple(None if g is None else g * self._grad_scale for g in grad_input)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        size = d // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, size).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(size)
        scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1)
        context = (probs @ v).transpose(1, 2).reshape(b, s, d)
        if self.bug == "data_inplace":
            probs.data.zero_()  # after its use: autograd's saved copy is now zeros
        h = self.out(context)
        if self.bug == "detach":
            h = h.detach()
        return self.norm(h + x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, inner: int, eps: float, bug: str = "") -> None:
        super().__init__()
        self.attn = Attention(dim, heads, eps, bug)
        self.ffn = FeedForward(dim, inner, eps, bug)
        self.bug = bug

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        y = self.ffn(self.attn(x, keep))
        if self.bug == "output_detach":
            return y.detach()
        if self.bug == "output_hook" and y.requires_grad:
            y.register_hook(lambda g: g * 1.05)
        if self.bug == "output_hook_inplace" and y.requires_grad:
            y.register_hook(lambda g: g.mul_(1.05))
        return y


class Embeddings(nn.Module):
    def __init__(self, vocab: int, positions: int, segments: int, dim: int,
                 eps: float) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(positions, dim)
        self.segments = nn.Embedding(segments, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        x = self.words(input_ids) + self.segments(token_type_ids)
        return self.norm(x + self.positions(torch.arange(s, device=input_ids.device)))


class Bert(nn.Module):
    """bert(input_ids, token_type_ids, attention_mask) -> last hidden states."""

    def __init__(self, hf: nn.Module, bug: str = "", layer: int = 0) -> None:
        super().__init__()
        c = hf.config
        dim, eps = c.hidden_size, c.layer_norm_eps
        self.embed = Embeddings(c.vocab_size, c.max_position_embeddings, c.type_vocab_size,
                                dim, eps)
        self.blocks = nn.ModuleList(
            Block(dim, c.num_attention_heads, c.intermediate_size, eps,
                  bug if i == layer else "") for i in range(c.num_hidden_layers))
        self.detach_after = layer if bug == "loop_detach" else -1
        self.embed_checkpoint = bug == "embed_checkpoint"
        self._load(hf)

    def _load(self, hf: nn.Module) -> None:
        theirs = {k: v.detach().clone() for k, v in hf.state_dict().items()}
        mine = {"embed.words.weight": "embeddings.word_embeddings.weight",
                "embed.positions.weight": "embeddings.position_embeddings.weight",
                "embed.segments.weight": "embeddings.token_type_embeddings.weight",
                "embed.norm.weight": "embeddings.LayerNorm.weight",
                "embed.norm.bias": "embeddings.LayerNorm.bias"}
        for i in range(len(self.blocks)):
            at, ours = f"encoder.layer.{i}.", f"blocks.{i}."
            for part, name in (("attn.q", "attention.self.query"),
                               ("attn.k", "attention.self.key"),
                               ("attn.v", "attention.self.value"),
                               ("attn.out", "attention.output.dense"),
                               ("attn.norm", "attention.output.LayerNorm"),
                               ("ffn.up", "intermediate.dense"),
                               ("ffn.down", "output.dense"),
                               ("ffn.norm", "output.LayerNorm")):
                for kind in ("weight", "bias"):
                    mine[f"{ours}{part}.{kind}"] = f"{at}{name}.{kind}"
        self.load_state_dict({k: theirs[v] for k, v in mine.items()})

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None \
            else attention_mask.bool()
        if self.embed_checkpoint:
            x = checkpoint(self.embed, input_ids, token_type_ids, use_reentrant=True)
        else:
            x = self.embed(input_ids, token_type_ids)
        for i, block in enumerate(self.blocks):
            x = block(x, keep)
            if i == self.detach_after:
                x = x.detach()
        return x


def build(reference: nn.Module, bug: str = "", layer: int = 1) -> Bert:
    if bug and bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}")
    model = Bert(reference, bug, layer).eval()
    _FirstWrong.backwards = 0
    if bug == "global_switch":
        global EXACT_GELU_BACKWARD
        EXACT_GELU_BACKWARD = False
    if bug == "class_patch":
        FeedForward.backward_scale = 1.01
    return model


def undo() -> None:
    """Put back the module state ``global_switch`` and ``class_patch`` changed."""
    global EXACT_GELU_BACKWARD
    EXACT_GELU_BACKWARD = True
    FeedForward.backward_scale = 1.0
