"""Decoder hints in a Llama-style attention: rotary on the wrong half, missing causal mask.

The attention module holding the divergence (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)
is re-run from its inputs on a run of the reference (hidden states, rotary cos/sin, mask);
the divergent node is identified by value among its steps, and each hypothesis re-runs the
attention with one classic porting bug. A hint is given only when the bug reproduces the
candidate's value within budget and far better than the unmodified attention, at every
position or at the real tokens alone (``tokens``). Nothing is inferred from names.
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

_FAULTS = {
    "rotary-wrong-half": ("the candidate applies rotary embeddings to the wrong half "
                          "(rotate_half gives [x₂, −x₁] instead of [−x₂, x₁])",
                          "rotating the other way in the reference"),
    "no-causal-mask": ("the candidate's attention has no causal mask (every token sees the "
                       "tokens after it)", "dropping the causal part of the reference's mask"),
    "gqa-tiled": ("the candidate repeats key/value heads in the wrong order for grouped-query "
                  "attention (0,1,0,1 instead of 0,0,1,1)",
                  "tiling the key/value heads in the reference"),
    "no-mask": ("the candidate's attention has no causal mask (every token sees the tokens "
                "after it), nor a padding mask (real tokens see the padding)",
                "dropping the reference's mask"),
}


def hints(context: DivergenceContext) -> list[str]:
    """Hints for a divergence inside a Llama-style attention; empty when none reproduces.

    Judged at every position, else at the real tokens alone (a port may compute anything
    at padded positions); the mask is the reference's own, or, where HF passed none (no
    padding: sdpa's ``is_causal``), the causal mask over the inputs' real tokens.
    """
    attention = _module(context.reference_model, context.module)
    keep = real_tokens(context.inputs)
    if keep is None or attention is None or not all(
            hasattr(attention, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
        return []
    captured = _captured_call(context.reference_model, attention, context.inputs)
    if captured is None:
        return []
    hidden, cos, sin, mask = captured
    if mask is None:  # HF let sdpa apply the causal mask (is_causal=True)
        mask = causal_mask(keep)
    base = _steps(attention, hidden, cos, sin, mask, fault="")
    reference = context.reference_value
    step = next((name for name, value in base.items() if value.shape == reference.shape
                 and _close(value, reference.to(value.dtype), real_in(value.shape, keep))),
                None)
    if step is None:
        return []
    candidate = context.candidate_value.to(base[step].dtype)
    real = real_in(candidate.shape, keep)
    allowed = budget(candidate, real, context.atol, context.rtol)
    found = []
    for fault, (what, how) in _FAULTS.items():
        if fault == "no-mask" and bool(keep.all()):
            continue  # without padding, the same as no causal mask
        value = _steps(attention, hidden, cos, sin, mask, fault=fault)[step]
        result = reproduces(value, base[step], candidate, real, allowed)
        if result is not None:
            found.append(sentence(what, how, result))
    return found


def _close(value: torch.Tensor, reference: torch.Tensor, real: torch.Tensor) -> bool:
    """Equal at the real tokens up to a recomputation's rounding."""
    return torch.allclose(value[real], reference[real], atol=1e-5, rtol=1e-4)


def _steps(attention: Any, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           mask: torch.Tensor | None, *, fault: str) -> dict[str, torch.Tensor]:
    """The attention's intermediates, with ``fault`` applied ("" for none)."""
    shape = (*hidden.shape[:-1], -1, attention.head_dim)
    q = attention.q_proj(hidden).view(shape).transpose(1, 2)  # (B, nh, S, hd)
    k = attention.k_proj(hidden).view(shape).transpose(1, 2)  # (B, kv, S, hd)
    v = attention.v_proj(hidden).view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    turned_q, turned_k = _rotate_half(q, fault), _rotate_half(k, fault)
    q_rot, k_rot = q * cos + turned_q * sin, k * cos + turned_k * sin
    repeats = q.shape[1] // k.shape[1]
    if fault == "gqa-tiled":
        k_rep, v_rep = k_rot.repeat(1, repeats, 1, 1), v.repeat(1, repeats, 1, 1)
    else:
        k_rep = k_rot.repeat_interleave(repeats, dim=1)
        v_rep = v.repeat_interleave(repeats, dim=1)
    if fault == "no-causal-mask" and mask is not None:
        mask = mask[:, :, -1:, :]  # the last query sees every real key: padding only
    if fault == "no-mask":
        mask = None
    context = F.scaled_dot_product_attention(q_rot, k_rep, v_rep, attn_mask=mask,
                                             scale=attention.scaling)
    merged = context.transpose(1, 2).reshape(*hidden.shape[:-1], -1)
    return {"rotate_half(q)": turned_q, "rotate_half(k)": turned_k, "q_rot": q_rot,
            "k_rot": k_rot, "k_rep": k_rep, "v_rep": v_rep, "context": context,
            "merged": merged, "output": attention.o_proj(merged)}


def _rotate_half(x: torch.Tensor, fault: str) -> torch.Tensor:
    first, second = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    if fault == "rotary-wrong-half":
        return torch.cat((second, -first), dim=-1)
    return torch.cat((-second, first), dim=-1)


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return model.get_submodule(path) if path else None
    except AttributeError:
        return None


def _captured_call(model: torch.nn.Module, attention: torch.nn.Module,
                   inputs: Any) -> tuple[Any, ...] | None:
    """(hidden states, cos, sin, mask) of the attention's first call on a reference run."""
    captured: list[tuple[Any, ...]] = []

    def keep(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.get("hidden_states")
        rotary = kwargs.get("position_embeddings")
        if not captured and isinstance(hidden, torch.Tensor) and rotary is not None:
            captured.append((hidden.detach(), *rotary, kwargs.get("attention_mask")))

    handle = attention.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return captured[0] if captured else None


__all__ = ["hints"]
