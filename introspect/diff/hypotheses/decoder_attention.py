"""Decoder hints in a Llama-style attention: rotary on the wrong half, missing causal mask.

The attention module holding the divergence (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``)
is re-run from its inputs on a run of the reference (hidden states, rotary cos/sin, mask);
the divergent node is identified by value among its steps, and each hypothesis re-runs the
attention with one classic porting bug. A hint is given only when the bug reproduces the
candidate's value within budget and far better than the unmodified attention. Nothing is
inferred from names.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from introspect.diff.hypotheses.context import DivergenceContext

_FAULTS = {
    "rotary-wrong-half": ("the candidate applies rotary embeddings to the wrong half "
                          "(rotate_half gives [x₂, −x₁] instead of [−x₂, x₁])",
                          "rotating the other way in the reference"),
    "no-causal-mask": ("the candidate's attention has no causal mask (every token sees the "
                       "tokens after it)", "dropping the causal part of the reference's mask"),
    "gqa-tiled": ("the candidate repeats key/value heads in the wrong order for grouped-query "
                  "attention (0,1,0,1 instead of 0,0,1,1)",
                  "tiling the key/value heads in the reference"),
}


def hints(context: DivergenceContext) -> list[str]:
    """Hints for a divergence inside a Llama-style attention; empty when none reproduces."""
    attention = _module(context.reference_model, context.module)
    if attention is None or not all(hasattr(attention, n) for n in
                                    ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim")):
        return []
    captured = _captured_call(context.reference_model, attention, context.inputs)
    if captured is None:
        return []
    base = _steps(attention, *captured, fault="")
    step = next((name for name, value in base.items()
                 if value.shape == context.reference_value.shape
                 and torch.allclose(value, context.reference_value.to(value.dtype),
                                    atol=1e-5, rtol=1e-4)), None)
    if step is None:
        return []
    candidate = context.candidate_value.to(base[step].dtype)
    base_error = float((base[step] - candidate).abs().max())
    budget = max(context.atol + context.rtol * float(candidate.abs().max()), 1e-5)
    found = []
    for fault, (what, how) in _FAULTS.items():
        value = _steps(attention, *captured, fault=fault)[step]
        error = float((value - candidate).abs().max())
        if error <= budget and error * 10 < base_error:
            found.append(f"{what}: {how} reproduces the candidate's values (max abs error "
                         f"{error:.2g} vs {base_error:.2g} unmodified)")
    return found


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
