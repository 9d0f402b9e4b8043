"""Trace-time values of leaf modules from shape rules, without running them.

Running a leaf (``nn.Linear``, ``nn.LayerNorm``, ...) under ``FakeTensorMode`` converts its
real weights to FakeTensors on every call and misses the dispatch cache, and that was
about half of the time of a BERT trace. The output of these modules is known from their
input and their configuration alone, so a rule builds the FakeTensor directly: the same
shape, dtype, strides and ``requires_grad`` as running the module would give.

A rule answers only where it is sure (contiguous inputs, matching dtypes, eval mode);
anywhere else ``leaf_value`` returns ``NO_RULE`` and the tracer runs the module on
FakeTensors as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

NO_RULE: Any = object()  # "no rule applies here: run the module on FakeTensors"

# Activation modules are elementwise: output = input's shape, dtype and strides.
_ELEMENTWISE = (torch.nn.Tanh, torch.nn.ReLU, torch.nn.GELU, torch.nn.Sigmoid, torch.nn.SiLU,
                torch.nn.Identity)
_ELEMENTWISE_PREFIX = "transformers.activations"


def leaf_value(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The FakeTensor ``module(*args, **kwargs)`` would return, or ``NO_RULE``.

    The input must be a FakeTensor: the new one belongs to the same ``FakeTensorMode``.
    """
    if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return NO_RULE
    rule = _rule_for(module)
    return NO_RULE if rule is None else rule(module, args[0])


def _rule_for(module: torch.nn.Module) -> Callable[[Any, torch.Tensor], Any] | None:
    kind = type(module)
    if kind is torch.nn.Linear:
        return _linear
    if kind is torch.nn.LayerNorm:
        return _layer_norm
    if kind is torch.nn.Embedding:
        return _embedding
    if kind is torch.nn.Dropout:
        return _dropout
    if kind in _ELEMENTWISE or (kind.__module__.startswith(_ELEMENTWISE_PREFIX)
                                and _is_plain_activation(module)):
        return _elementwise
    return None


def _is_plain_activation(module: torch.nn.Module) -> bool:
    # HF's activation modules have no parameters and no children; anything else (a
    # module holding weights) is not elementwise and runs on FakeTensors.
    return not any(True for _ in module.parameters()) and not any(True for _ in module.children())


def _linear(module: torch.nn.Linear, x: torch.Tensor) -> Any:
    if x.ndim == 0 or x.shape[-1] != module.in_features or x.dtype != module.weight.dtype:
        return NO_RULE
    return _new(x, (*x.shape[:-1], module.out_features), x.dtype, module.parameters())


def _layer_norm(module: torch.nn.LayerNorm, x: torch.Tensor) -> Any:
    normalized = tuple(module.normalized_shape)
    if tuple(x.shape[x.ndim - len(normalized):]) != normalized:
        return NO_RULE
    if module.weight is not None and module.weight.dtype != x.dtype:
        return NO_RULE
    return _new(x, tuple(x.shape), x.dtype, module.parameters())  # layer_norm: contiguous out


def _embedding(module: torch.nn.Embedding, indices: torch.Tensor) -> Any:
    if indices.dtype not in (torch.long, torch.int):
        return NO_RULE
    return _new(indices, (*indices.shape, module.embedding_dim), module.weight.dtype,
                module.parameters())


def _dropout(module: torch.nn.Dropout, x: torch.Tensor) -> Any:
    # In eval mode F.dropout returns its input itself, which is what the graph holds.
    return NO_RULE if module.training else x


def _elementwise(module: torch.nn.Module, x: torch.Tensor) -> Any:
    # Elementwise outputs follow the input's layout; only the contiguous case is certain.
    if not x.is_contiguous() or not x.is_floating_point():
        return NO_RULE
    return _new(x, tuple(x.shape), x.dtype, ())


def _new(like: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
         parameters: Any) -> torch.Tensor:
    """A contiguous FakeTensor like ``like``'s, with the requires_grad autograd would give.

    Built around a meta tensor directly: making it with ``torch.empty`` under the fake
    mode costs a dispatch through the mode, several times slower, for the same tensor.
    """
    if not like.is_contiguous() or not isinstance(like, FakeTensor):
        return NO_RULE
    requires_grad = torch.is_grad_enabled() and (
        like.requires_grad or any(p.requires_grad for p in parameters))
    meta = torch.empty(shape, dtype=dtype, device="meta")
    try:
        return FakeTensor(like.fake_mode, meta, like.device, requires_grad=requires_grad)
    except TypeError:  # FakeTensor's constructor is torch-internal: run the module instead
        return NO_RULE
