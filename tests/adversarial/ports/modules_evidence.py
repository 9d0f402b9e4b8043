"""Ports whose fault sits where an op-level recording cannot see the plain call (issue 41,
module evidence; imports only torch, NumPy and the sibling ``adv_bert``).

Each mechanism has ``correct_<name>`` and ``faulty_<name>``; the fault is in layer 1 and
small: the tanh GELU on a quarter of the FFN's units (``partial_tanh``), which moves
bert-tiny's outputs (perturbed) by less than their budget, or a LayerNorm eps of 3e-5.

- ``compiled``: layer 1's FFN is ``torch.compile``d (``backend="eager"``);
- ``compiling``: the same compiled FFN takes the tanh GELU only on the
  ``torch.compiler.is_compiling()`` branch;
- ``numpy``: layer 1's second LayerNorm computed in NumPy (float64; faulty: eps 3e-5);
- ``grad``: the tanh GELU only when autograd is on;
- ``thread``: layer 1's FFN computed in a worker thread;
- ``vmap``: attention computed per head under ``torch.func.vmap`` (faulty: the softmax
  temperature off by 1e-2);
- ``custom_op``: the GELU as a ``torch.library.custom_op``.
"""

from __future__ import annotations

import concurrent.futures

import adv_bert
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

QUARTER = 4  # the tanh GELU on the first 1/QUARTER of the FFN's units


def partial_tanh(h: torch.Tensor) -> torch.Tensor:
    cut = h.shape[-1] // QUARTER
    return torch.cat([F.gelu(h[..., :cut], approximate="tanh"), F.gelu(h[..., cut:])], -1)


class FFN(nn.Module):
    """The feed-forward half of a layer: ``norm2(x + out(act(inn(x))))``."""

    def __init__(self, block: adv_bert.Block, act) -> None:
        super().__init__()
        self.ffn_in, self.ffn_out, self.norm2 = block.ffn_in, block.ffn_out, block.norm2
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(x + self.ffn_out(self.act(self.ffn_in(x))))


class SplitBlock(adv_bert.Block):
    """A block whose FFN is a module of its own (``self.ffn``), set by the builders."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ffn: nn.Module | None = None

    def forward(self, x, mask):
        if self.ffn is None:
            return super().forward(x, mask)
        x = self.norm1(x + self.proj(self.attend(x, mask)))
        return self.ffn(x)


def _with_ffn(reference, make) -> nn.Module:
    model = adv_bert.build(reference, SplitBlock)
    block = model.blocks[adv_bert.fault_layer(reference)]
    block.ffn = make(block)
    return model


def _compiling_act(h):
    return partial_tanh(h) if torch.compiler.is_compiling() else F.gelu(h)


def correct_compiled(reference):
    return _with_ffn(reference, lambda b: torch.compile(FFN(b, F.gelu), backend="eager"))


def faulty_compiled(reference):
    return _with_ffn(reference, lambda b: torch.compile(FFN(b, partial_tanh), backend="eager"))


def correct_compiling(reference):
    return _with_ffn(reference, lambda b: torch.compile(
        FFN(b, lambda h: F.gelu(h) if torch.compiler.is_compiling() else F.gelu(h)),
        backend="eager"))


def faulty_compiling(reference):
    return _with_ffn(reference, lambda b: torch.compile(FFN(b, _compiling_act),
                                                        backend="eager"))


class NumpyLayerNorm(nn.LayerNorm):
    """A LayerNorm computed in NumPy (float64), its result handed back as a tensor."""

    numpy_eps: float | None = None

    def forward(self, x):
        a = x.detach().cpu().numpy().astype(np.float64)
        mean = a.mean(-1, keepdims=True)
        var = ((a - mean) ** 2).mean(-1, keepdims=True)
        eps = self.eps if self.numpy_eps is None else self.numpy_eps
        y = (a - mean) / np.sqrt(var + eps)
        y = y * self.weight.detach().numpy() + self.bias.detach().numpy()
        return torch.from_numpy(y.astype(np.float32))


def _numpy(reference, eps=None):
    model = adv_bert.build(reference)
    block = model.blocks[adv_bert.fault_layer(reference)]
    norm = NumpyLayerNorm(block.norm2.normalized_shape, eps=block.norm2.eps)
    norm.load_state_dict(block.norm2.state_dict())
    norm.numpy_eps = eps
    block.norm2 = norm
    return model.eval()


def correct_numpy(reference):
    return _numpy(reference)


def faulty_numpy(reference):
    return _numpy(reference, eps=3e-5)


def _grad_act(h):
    return partial_tanh(h) if torch.is_grad_enabled() else F.gelu(h)


def correct_grad(reference):
    return _with_ffn(reference, lambda b: FFN(b, F.gelu))


def faulty_grad(reference):
    return _with_ffn(reference, lambda b: FFN(b, _grad_act))


class ThreadedFFN(nn.Module):
    """Runs its FFN in a worker thread (as a pipeline or a server's pool would)."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__()
        self.inner = ffn

    def forward(self, x):
        grad = torch.is_grad_enabled()

        def work():
            with torch.set_grad_enabled(grad):
                return self.inner(x)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(work).result()


def correct_thread(reference):
    return _with_ffn(reference, lambda b: ThreadedFFN(FFN(b, F.gelu)))


def faulty_thread(reference):
    return _with_ffn(reference, lambda b: ThreadedFFN(FFN(b, partial_tanh)))


class VmapBlock(adv_bert.Block):
    """Attention per head under ``torch.func.vmap``; ``temperature`` scales the scores."""

    temperature = 1.0

    def attend(self, x, mask):
        B, S, H = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scale, temperature = self.scale(), self.temperature
        fill = torch.finfo(x.dtype).min

        def head(qh, kh, vh):  # (B, S, hd) each
            scores = qh @ kh.transpose(-1, -2) * scale * temperature  # (B, S, S)
            scores = scores.masked_fill(~mask[:, 0], fill)
            return scores.softmax(-1) @ vh

        y = torch.func.vmap(head, in_dims=1, out_dims=1)(q, k, v)  # (B, nh, S, hd)
        return y.transpose(1, 2).reshape(B, S, H)


def _vmap(reference, temperature):
    model = adv_bert.build(reference, VmapBlock)
    model.blocks[adv_bert.fault_layer(reference)].temperature = temperature
    return model


def correct_vmap(reference):
    return _vmap(reference, 1.0)


def faulty_vmap(reference):
    return _vmap(reference, 1.01)


@torch.library.custom_op("introspect_tests::gelu_exact", mutates_args=())
def gelu_exact(h: torch.Tensor) -> torch.Tensor:
    return F.gelu(h)


@torch.library.custom_op("introspect_tests::gelu_partial_tanh", mutates_args=())
def gelu_partial_tanh(h: torch.Tensor) -> torch.Tensor:
    return partial_tanh(h)


def correct_custom_op(reference):
    return _with_ffn(reference, lambda b: FFN(b, gelu_exact))


def faulty_custom_op(reference):
    return _with_ffn(reference, lambda b: FFN(b, gelu_partial_tanh))


class InPlaceBlock(adv_bert.Block):
    """Adds its residuals in place into the Linears' outputs (correct: same values)."""

    def forward(self, x, mask):
        y = self.proj(self.attend(x, mask))
        y += x  # the Linear's output, edited after it returned
        x = self.norm1(y)
        z = self.ffn_out(self.activation(self.ffn_in(x)))
        z += x
        return self.norm2(z)


def correct_inplace(reference):
    return adv_bert.build(reference, InPlaceBlock)
