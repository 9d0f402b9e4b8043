"""GPT-2 hints: a Conv1D weight used the wrong way round, q/k/v cut in another order.

GPT-2 keeps its projections in ``Conv1D`` modules whose weight is stored (in, out) and
applied as ``x @ W + b``, where ``nn.Linear`` stores (out, in). The classic porting bugs
keep every shape when they happen:

- a square weight (the attention's ``c_proj``, H x H) used untransposed by a port written
  with ``nn.Linear``, or transposed twice;
- the fused query/key/value projection (``c_attn``, H x 3H) cut into blocks in another
  order than q, k, v: in the weight (the divergence is the projection's output) or when
  its output is split (the divergence is the attention);
- the attention without its causal mask, or without the 1/sqrt(head size) scale.

The divergent module (a Conv1D, or GPT-2's attention) is re-run on its input from a run
of the reference, with each bug applied; a hint is given only when one reproduces the
candidate's value within budget and far better than the unmodified module, at every
position or at the real tokens alone (``tokens``). The attention's mask is the inputs'
padding and the causal mask, also where the inputs hold no ``attention_mask``. Nothing is
inferred from names.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from introspect.diff.hypotheses.context import DivergenceContext
from introspect.diff.hypotheses.tokens import (
    budget,
    causal_mask,
    real_in,
    real_tokens,
    reproduces,
    sentence,
)

_QKV = ("query", "key", "value")
_SWAPS = ((0, 1), (1, 2), (0, 2))  # block pairs swapped: q/k, k/v, q/v


def hints(context: DivergenceContext) -> list[str]:
    """Hints for a divergence in a Conv1D or a GPT-2 attention; empty when none reproduces."""
    module = _module(context.reference_model, context.module)
    if module is None:
        return []
    if _is_conv1d(module):
        inputs = _captured_input(context.reference_model, module, context.inputs)
        if inputs is None:
            return []
        weight, bias = _weight_and_bias(module)
        base = {"output": _applied(inputs, weight, bias)}
        variants = [(what, how, {"output": value}) for what, how, value
                    in _conv1d_variants(context.module, inputs, weight, bias)]
    elif all(hasattr(module, n) for n in ("c_attn", "c_proj", "split_size", "scaling")) \
            and _is_conv1d(module.c_attn):
        inputs = _captured_input(context.reference_model, module, context.inputs)
        mask = real_tokens(context.inputs)
        if inputs is None or mask is None:
            return []
        base = _attention_steps(module, inputs, mask, fault="")
        variants = [(what, how, _attention_steps(module, inputs, mask, fault=fault))
                    for fault, (what, how) in _ATTENTION_FAULTS.items()
                    if fault != "no-mask" or not bool(mask.all())]  # else: no causal mask
    else:
        return []
    return _reproduced(context, base, variants)


def _reproduced(context: DivergenceContext, base: dict[str, torch.Tensor],
                variants: list[tuple[str, str, dict[str, torch.Tensor]]]) -> list[str]:
    """The variants that reproduce the candidate at the step the divergence is."""
    keep = real_tokens(context.inputs)
    if keep is None:
        return []
    reference = context.reference_value
    step = None
    for name, value in base.items():
        if value.numel() == reference.numel():
            real = real_in(value.shape, keep)
            laid = reference.to(value.dtype).reshape(value.shape)
            if torch.allclose(value[real], laid[real], atol=1e-5, rtol=1e-4):
                step = name
                break
    if step is None:
        return []  # the divergent node is none of the steps re-run here
    unmodified = base[step]
    candidate = context.candidate_value.to(unmodified.dtype).reshape(unmodified.shape)
    real = real_in(unmodified.shape, keep)
    allowed = budget(candidate, real, context.atol, context.rtol)
    found = []
    for what, how, steps in variants:
        result = reproduces(steps[step], unmodified, candidate, real, allowed)
        if result is not None:
            found.append(sentence(what, how, result))
    return found


def _weight_and_bias(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    weight, bias = module.weight, module.bias
    assert isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor)
    return weight, bias


def _is_conv1d(module: Any) -> bool:
    weight = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) \
        and weight.ndim == 2 and isinstance(getattr(module, "bias", None), torch.Tensor)


_ATTENTION_FAULTS = {
    **{f"{_QKV[a]}-{_QKV[b]}": (f"the candidate splits its fused projection's output with the "
                                f"{_QKV[a]} and {_QKV[b]} swapped",
                                f"swapping the {_QKV[a]} and {_QKV[b]} in the reference's "
                                "attention") for a, b in _SWAPS},
    "no-causal-mask": ("the candidate's attention has no causal mask (every token sees the "
                       "tokens after it)", "dropping the causal mask in the reference"),
    "no-mask": ("the candidate's attention has no causal mask (every token sees the tokens "
                "after it), nor a padding mask (real tokens see the padding)",
                "dropping the reference's mask"),
    "unscaled": ("the candidate's attention scores are not scaled by 1/sqrt(head size)",
                 "leaving out the scale in the reference"),
}


def _attention_steps(attention: Any, hidden: torch.Tensor, attention_mask: torch.Tensor, *,
                     fault: str) -> dict[str, torch.Tensor]:
    """GPT-2's attention re-run step by step on ``hidden``, with ``fault`` ("" for none)."""
    parts = list(_applied(hidden, *_weight_and_bias(attention.c_attn))
                 .split(attention.split_size, dim=-1))
    if fault in _ATTENTION_FAULTS and fault.split("-")[0] in _QKV:
        a, b = (_QKV.index(name) for name in fault.split("-"))
        parts[a], parts[b] = parts[b], parts[a]
    B, S = hidden.shape[:2]
    q, k, v = (p.view(B, S, -1, attention.head_dim).transpose(1, 2) for p in parts)
    keys = attention_mask[:, None, None, :].bool()  # (B, 1, 1, S): real keys
    allowed: torch.Tensor | None = causal_mask(attention_mask.bool())
    if fault == "no-causal-mask":
        allowed = keys
    elif fault == "no-mask":
        allowed = None
    scale = 1.0 if fault == "unscaled" else attention.scaling
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    merged = context.transpose(1, 2).reshape(B, S, -1)
    return {"query": q, "key": k, "value": v, "context": context, "merged": merged,
            "output": _applied(merged, *_weight_and_bias(attention.c_proj))}


def _conv1d_variants(path: str, inputs: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor) -> list[tuple[str, str, torch.Tensor]]:
    """(what the candidate does, how the reference is changed, the changed output)."""
    variants = []
    rows, columns = weight.shape
    if rows == columns:
        variants.append((f"the candidate's {path} multiplies by its weight transposed (GPT-2's "
                         "Conv1D stores it as (in, out), nn.Linear as (out, in))",
                         "transposing the reference's weight",
                         _applied(inputs, weight.T, bias)))
    if columns == 3 * rows:  # a fused query, key, value projection
        for a, b in _SWAPS:
            order = [0, 1, 2]
            order[a], order[b] = b, a
            variants.append((f"the candidate's fused query/key/value projection ({path}) holds "
                             f"the {_QKV[a]} and {_QKV[b]} blocks swapped",
                             f"swapping the {_QKV[a]} and {_QKV[b]} blocks of the reference's "
                             "weight and bias",
                             _applied(inputs, _blocks(weight, order, 1), _blocks(bias, order, 0))))
    return variants


def _applied(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What a Conv1D computes: ``x @ W + b`` over the last dimension."""
    return inputs @ weight + bias


def _blocks(tensor: torch.Tensor, order: list[int], dim: int) -> torch.Tensor:
    parts = tensor.chunk(3, dim=dim)
    return torch.cat([parts[i] for i in order], dim=dim)


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return model.get_submodule(path) if path else None
    except AttributeError:
        return None


def _captured_input(model: torch.nn.Module, module: torch.nn.Module,
                    inputs: Any) -> torch.Tensor | None:
    """The module's input (its first argument) on its first call in a run of the reference."""
    captured: list[torch.Tensor] = []

    def keep(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        value = args[0] if args else kwargs.get("hidden_states")
        if not captured and isinstance(value, torch.Tensor):
            captured.append(value.detach())

    handle = module.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return captured[0] if captured else None


__all__ = ["hints"]
