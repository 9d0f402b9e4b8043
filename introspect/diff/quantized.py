"""Int8 quantized Linears (``torch.ao.quantization.quantize_dynamic``): their weights, and
how far int8 rounding may move their outputs.

A quantized Linear keeps its weight packed for its kernel, not as a parameter: alignment
reads it back dequantized (``module.weight().dequantize()``) with its quantization step
(the scale, per tensor or per output channel), so that it relates to the float weight it
was quantized from (every element within one step). Its output differs from the float
Linear's by the rounding of the weight (at most half a step, one where the range was
clamped) and of the input, which the dynamic kernel quantizes per tensor to 8 bits on the
fly (``reduce_range`` keeps 7 of them on x86). ``int8_noise`` bounds that error for one
input, in the manner of a sum of independent rounding errors.

Example::

    >>> packed = quantized_weights("encoder.q", torch.ao.quantization.quantize_dynamic(
    ...     torch.nn.Linear(4, 2), {torch.nn.Linear}))  # doctest: +SKIP
    >>> [label for label, _, _ in packed]
    ['encoder.q.weight', 'encoder.q.bias']
"""

from __future__ import annotations

import math
from typing import Any

import torch

# The name int8 rounding goes by among a model's dtypes (``explain.model_dtypes``).
INT8 = "qint8"
# The activation's 8-bit range as the dynamic kernels quantize it: 7 bits with
# ``reduce_range`` (fbgemm, x86), 8 without (qnnpack); the coarser step is assumed.
_ACTIVATION_LEVELS = 127


def is_quantized(module: torch.nn.Module) -> bool:
    """A module whose weight is packed int8 (``torch.ao.nn.quantized`` Linears, dynamic or not)."""
    weight = getattr(module, "weight", None)
    if not callable(weight) or not hasattr(module, "_packed_params"):
        return False
    try:
        value = weight()
    except Exception:  # noqa: BLE001  a packing this does not know: not read
        return False
    # (``quantize_dynamic(dtype=torch.float16)`` packs its weight as float16 instead, and
    # hands it back widened to float32)
    float16 = getattr(getattr(module, "_packed_params", None), "dtype", None) == torch.float16
    return isinstance(value, torch.Tensor) and (value.is_quantized or float16)


def packing(module: torch.nn.Module) -> str:
    """What a quantized Linear (``is_quantized``) packs its weight as: "int8", or "float16"
    (``quantize_dynamic(dtype=torch.float16)``, whose weight comes back as a float tensor).
    The one place the two are told apart: the notes, budgets and the alignment's relation
    kinds (``align.weights``) all read it."""
    return "int8" if _packed(module).is_quantized else "float16"


def quantized_word(model: torch.nn.Module) -> str:
    """What a model's quantized Linears hold: "int8", "float16", or both."""
    kinds = sorted({packing(m) for m in model.modules() if is_quantized(m)}, reverse=True)
    return " and ".join(kinds) or "int8"


def holds_quantized(model: torch.nn.Module) -> bool:
    return any(type(m).__module__.startswith("torch.ao.nn.quantized") and is_quantized(m)
               for m in model.modules())


def quantized_weights(path: str, module: torch.nn.Module,
                      ) -> list[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """(label, value, step) of a quantized module's weight and bias, as the float Linear
    names them (``{path}.weight``, ``{path}.bias``); the bias is float: no step."""
    if not is_quantized(module):
        return []
    packed = _packed(module)
    found: list[tuple[str, torch.Tensor, torch.Tensor | None]] = [
        (f"{path}.weight", _unpacked(packed), weight_step(packed))]
    bias_of = getattr(module, "bias", None)
    bias = bias_of() if callable(bias_of) else None
    if isinstance(bias, torch.Tensor):
        found.append((f"{path}.bias", bias.detach(), None))
    return found


def _packed(module: torch.nn.Module) -> torch.Tensor:
    """The int8 weight, unpacked (``weight`` is a method of a quantized Linear)."""
    weight: Any = getattr(module, "weight")  # noqa: B009  a method, not a Parameter
    return weight()


def _unpacked(packed: torch.Tensor) -> torch.Tensor:
    """The weight as the float Linear holds it: dequantized, or a float16 one widened."""
    return packed.dequantize() if packed.is_quantized else packed.float()


def weight_step(packed: torch.Tensor) -> torch.Tensor:
    """The quantization step of each element of a quantized weight, broadcastable to it:
    a scalar per tensor, a column of one scale per output channel; for a float16 weight,
    each element's own (its magnitude times float16's epsilon, at least its smallest
    step)."""
    if not packed.is_quantized:
        return (packed.double().abs() * torch.finfo(torch.float16).eps).clamp(min=2.0 ** -24)
    if packed.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric,
                            torch.per_channel_affine_float_qparams):
        scales = packed.q_per_channel_scales().double()
        shape = [1] * packed.ndim
        shape[packed.q_per_channel_axis()] = -1
        return scales.reshape(shape)
    return torch.tensor(float(packed.q_scale()), dtype=torch.float64)


def within_one_step(value: torch.Tensor, reference: torch.Tensor, step: torch.Tensor) -> bool:
    """Whether every element of ``value`` lies within one quantization step of ``reference``
    (half a step is rounding, a whole one the clamp at the range's end)."""
    if value.shape != reference.shape:
        return False
    d = (value.double() - reference.detach().double()).abs()
    return bool((d <= step * (1 + 1e-6) + 1e-12).all())


def int8_noise(module: torch.nn.Module, data: Any) -> float | None:
    """How far int8 rounding moves a quantized Linear's output on input ``data``: the
    largest standard deviation, over output elements, of the sum of its rounding errors.

    Each product ``x_k * w_jk`` is off by ``x_k * dw + w_jk * dx``, the roundings ``dw``
    (step ``s_w``) and ``dx`` (step ``s_x``, from the input's range) uniform and
    independent: the variance of output ``j`` of row ``n`` is
    ``s_w^2/12 * sum_k x_nk^2 + s_x^2/12 * sum_k w_jk^2``. None for anything else.
    """
    if not is_quantized(module) or not isinstance(data, torch.Tensor) \
            or not data.is_floating_point() or data.numel() == 0:
        return None
    packed = _packed(module)
    weight = _unpacked(packed).double()  # (out, in)
    x = data.detach().double().reshape(-1, data.shape[-1])  # (rows, in)
    if x.shape[-1] != weight.shape[-1]:
        return None
    w_step = weight_step(packed).reshape(-1)  # (1,) or (out,)
    span = float(x.max().clamp(min=0) - x.min().clamp(max=0))
    x_step = span / _ACTIVATION_LEVELS if packed.is_quantized else 0.0  # (float16 weights:
    # the input stays float32)
    from_weight = float((w_step ** 2).max()) / 12 * float((x ** 2).sum(dim=1).max())
    from_input = x_step ** 2 / 12 * float((weight ** 2).sum(dim=1).max())
    return math.sqrt(from_weight + from_input)


__all__ = ["INT8", "holds_quantized", "int8_noise", "is_quantized", "packing",
           "quantized_weights",
           "quantized_word", "weight_step", "within_one_step"]
