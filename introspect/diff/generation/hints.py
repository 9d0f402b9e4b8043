"""Hints for incremental-decoding bugs, each tested on the values of the failing step.

A step after the prefill fails; which classic bug of a port's cached path reproduces it?

- **Positions not advanced** (restart at 0, or off by one) and **rotary at the wrong
  offset**: the reference's step is run again from its own cache as it was before the
  step, at other positions (``position_ids``: 0, p - 1, p + 1); reported when one of them
  reproduces the candidate's logits and the unmodified step does not.
- **Cache updated twice, or not at all**: the candidate's cache after the step holds the
  step's keys twice (one slot more than the reference, its last slots equal), or never
  took them (one slot less, the rest equal; or, pre-allocated, the slot left empty).
- **Keys cached at the wrong rotary offset**: the candidate's newly cached keys are the
  reference's rotated by another angle (rotate-half rotary of the reference's
  frequencies), the queries being right.
- **Attention variants** (the causal mask applied to a length-1 query as if it were a
  prompt, so it sees only the first key; attention over the pre-allocated, unfilled part of
  a static cache; grouped-query heads repeated in the wrong order on the cached path): the
  reference's step is run again with its attention function swapped (HF's
  ``ALL_ATTENTION_FUNCTIONS``) for the variant.
- **Keys concatenated on the wrong axis**: a step that fails in a concatenation of tensors
  whose sizes do not match.

Nothing is inferred from names; where nothing reproduces the values, no hint is given.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from introspect.diff.generation.caches import compare_cached, sequence_axis
from introspect.diff.generation.protocol import cache_keyword
from introspect.diff.generation.records import CacheDiff
from introspect.diff.records import Divergence
from introspect.diff.tolerance import Budget, Tolerance

# A variant reproduces the candidate when its error is at most this share of the
# unmodified step's error, and within rounding of the logits' scale.
_FAR_BETTER = 0.01
_ROUNDING = 1e-4


@dataclass
class StepContext:
    """One failing step: what each side computed and what the reference held before."""

    step: int
    position: int  # the position of the step's first token
    fed: torch.Tensor  # the tokens fed, (1, T)
    reference: torch.nn.Module
    reference_cache: Any  # a copy of the reference's cache before the step (None: no copy)
    reference_logits: torch.Tensor
    candidate_logits: torch.Tensor
    caches: Sequence[CacheDiff]  # the step's cache rows
    reference_layers: list[tuple[torch.Tensor, torch.Tensor]] | None  # after the step
    candidate_layers: list[tuple[torch.Tensor, torch.Tensor]] | None
    tolerance: Tolerance
    divergence: Divergence | None


def explain(context: StepContext) -> tuple[str, ...]:
    """The hints that reproduce the step's values, most precise first."""
    with torch.no_grad():
        found = _cache_updates(context)
        if not found:
            found = _positions(context)
        if not found:
            found = _key_rotation(context)
        if not found and _cache_follows(context):
            found = _attention_variants(context)
    return tuple(found)


def _cache_follows(context: StepContext) -> bool:
    """No cached tensor differs before the layer of the step's first divergent node (those
    after it differ because their inputs do)."""
    failing = [r.layer for r in context.caches if not r.passed]
    if not failing:
        return True
    d = context.divergence
    digits = [int(part) for part in (d.layer if d else "").split(".") if part.isdigit()]
    return bool(digits) and min(failing) > digits[-1]


def crash_hints(message: str) -> tuple[str, ...]:
    """A step that failed: concatenation sizes that do not match."""
    lowered = message.lower()
    if "sizes of tensors must match" in lowered or ("cat" in lowered and "size" in lowered):
        return ("the candidate's cached keys or values are concatenated on the wrong axis: "
                "its step failed joining the cache with the new token's tensors "
                "(their sizes match on every axis but the one it joined on)",)
    return ()


# ---------------------------------------------------------------------------------------
# Re-running the reference's step


def _rerun(context: StepContext, **keywords: Any) -> torch.Tensor | None:
    """The reference's logits for the step, from its cache as it was, with ``keywords``."""
    if context.reference_cache is None:
        return None
    cache = copy.deepcopy(context.reference_cache)
    name = cache_keyword(context.reference) or "past_key_values"
    try:
        output = context.reference(input_ids=context.fed, use_cache=True,
                                   **{name: cache}, **keywords)
    except Exception:  # a reference that takes no such argument: no hint
        return None
    logits = output.logits if hasattr(output, "logits") else \
        output[0] if isinstance(output, (tuple, list)) else output
    return logits if isinstance(logits, torch.Tensor) else None


def _reproduces(context: StepContext, variant: torch.Tensor | None) -> tuple[float, float] | None:
    """(variant's error, unmodified error) against the candidate, when the variant wins."""
    if variant is None or variant.shape != context.candidate_logits.shape:
        return None
    candidate = context.candidate_logits.to(variant.dtype)
    error = float((variant - candidate).abs().max())
    base = float((context.reference_logits.to(variant.dtype) - candidate).abs().max())
    scale = max(1.0, float(context.reference_logits.abs().max()))
    if base > 0 and error <= _FAR_BETTER * base and error <= _ROUNDING * scale:
        return error, base
    return None


def _positions(context: StepContext) -> list[str]:
    p = context.position
    length = context.fed.shape[1]
    tried = dict.fromkeys(q for q in (0, p - 1, p + 1, 1) if q >= 0 and q != p)
    rotary = _rotary_frequencies(context.reference) is not None
    for q in tried:
        ids = torch.arange(q, q + length).unsqueeze(0)
        found = _reproduces(context, _rerun(context, position_ids=ids))
        if found is None:
            continue
        how = "restart at 0" if q == 0 else f"off by {q - p:+d}"
        what = (f"the candidate's rotary embeddings are at the wrong offset at step "
                f"{context.step}: position {q} where the reference's are at {p} (positions "
                f"not advanced with the cache: {how})") if rotary else \
            (f"the candidate's positions are not advanced with the cache at step "
             f"{context.step} ({how}): it used position {q} where the reference used {p}")
        return [f"{what}; running the reference's step at position {q} reproduces the "
                f"candidate's logits (max abs error {found[0]:.2g} vs {found[1]:.2g} "
                "unmodified)"]
    return []


# ---------------------------------------------------------------------------------------
# The cache's own values


def _cache_updates(context: StepContext) -> list[str]:
    failing = [r for r in context.caches if not r.passed]
    if not failing or not context.reference_layers or not context.candidate_layers:
        return []
    row = failing[0]
    ref_pair = context.reference_layers[row.layer]
    cand_pair = context.candidate_layers[row.layer]
    ref, cand = (ref_pair[0], cand_pair[0]) if row.kind == "keys" else (ref_pair[1], cand_pair[1])
    filled, new = row.filled, context.fed.shape[1]
    budget = context.tolerance.node_budget(str(ref.dtype).removeprefix("torch."))
    axis = sequence_axis(ref, filled)
    if axis is None:
        return []
    where = f"layer {row.layer}'s cached {row.kind} after step {context.step}"
    # one slot more: the step's keys appended twice (the last `new` slots a copy)
    for a in range(cand.dim()):
        if cand.shape[a] == filled + new:
            once = cand.narrow(a, 0, filled)
            again = cand.narrow(a, filled, new)
            if compare_cached(ref, once, budget, filled).passed and torch.equal(
                    again, cand.narrow(a, filled - new, new)):
                return [f"the candidate's cache is updated twice at step {context.step}: "
                        f"{where} hold {filled + new} positions, the reference's {filled}, "
                        "the step's keys and values appended a second time"]
        if cand.shape[a] == filled - new and filled - new > 0:
            before = ref.narrow(axis, 0, filled - new)
            if compare_cached(before, cand, budget, filled - new).passed:
                return [f"the candidate's cache is not updated at step {context.step}: "
                        f"{where} hold {filled - new} positions, the reference's {filled}; "
                        "the step's keys and values were never added"]
    found = compare_cached(ref, cand, budget, filled)
    if found.candidate_filled is not None and found.layout:
        view = ref.movedim(axis, 1)
        part = found.candidate_filled
        older_ok = bool(torch.allclose(part[:, :filled - new], view[:, :filled - new],
                                       atol=budget.atol, rtol=budget.rtol))
        slot = part[:, filled - new:]
        if older_ok and "pre-allocated" in found.layout and not bool(slot.any()):
            return [f"the candidate's cache is not updated at step {context.step}: the slot "
                    f"of position {filled - new} in {where} is still empty (its static cache "
                    "pre-allocated, never written there)"]
    return []


def _key_rotation(context: StepContext) -> list[str]:
    """The new keys in the candidate's cache are the reference's rotated by another angle."""
    inv_freq = _rotary_frequencies(context.reference)
    failing = [r for r in context.caches if not r.passed]
    if inv_freq is None or not failing or failing[0].kind != "keys" or any(
            r.layer == failing[0].layer and r.kind == "values" for r in failing):
        return []  # the first layer that differs must differ in its keys alone
    if not context.reference_layers or not context.candidate_layers:
        return []
    row = failing[0]
    ref = context.reference_layers[row.layer][0]
    cand = context.candidate_layers[row.layer][0]
    budget = context.tolerance.node_budget(str(ref.dtype).removeprefix("torch."))
    found = compare_cached(ref, cand, Budget(math.inf, 0.0), row.filled)  # the layout only
    axis = sequence_axis(ref, row.filled)
    if found.candidate_filled is None or axis is None:
        return []
    p, new = context.position, context.fed.shape[1]
    ref_new = ref.movedim(axis, 1)[:, p:p + new]  # (B, T, nkv, hd): rotated at p
    cand_new = found.candidate_filled[:, p:p + new]
    if ref_new.shape != cand_new.shape or ref_new.shape[-1] != 2 * inv_freq.numel():
        return []
    for q in dict.fromkeys(x for x in (0, p - 1, p + 1) if x >= 0 and x != p):
        turned = _rotate(ref_new, (q - p) * torch.ones(new), inv_freq)
        if torch.allclose(turned.to(cand_new.dtype), cand_new, atol=10 * budget.atol,
                          rtol=10 * budget.rtol):
            return [f"the candidate caches its keys at the wrong rotary offset at step "
                    f"{context.step}: {row.kind} of layer {row.layer} are the reference's "
                    f"rotated to position {q} instead of {p} (rotating the reference's keys "
                    f"by {q - p:+d} positions reproduces them)"]
    return []


def _rotary_frequencies(model: torch.nn.Module) -> torch.Tensor | None:
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor) and inv_freq.dim() == 1:
            return inv_freq.float()
    return None


def _rotate(x: torch.Tensor, offsets: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary by ``offsets`` positions along x's axis 1 (B, T, heads, hd)."""
    angles = offsets.float()[:, None] * inv_freq[None, :]  # (T, hd/2)
    emb = torch.cat([angles, angles], dim=-1)[None, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * emb.cos() + rotated.float() * emb.sin()).to(x.dtype)


# ---------------------------------------------------------------------------------------
# Attention variants, run through HF's attention registry


_VARIANTS = {
    "prompt-mask": "the candidate applies the causal mask to its length-1 query as if it were "
                   "a prompt (the query at row 0 sees only the first key)",
    "unfilled": "the candidate's attention reads the pre-allocated, unfilled part of its static "
                "cache (zero keys and values past the filled positions are attended)",
    "gqa-tiled": "the candidate repeats key/value heads in the wrong order on the cached path "
                 "(0,1,0,1 instead of 0,0,1,1)",
}


def _attention_variants(context: StepContext) -> list[str]:
    allocated = _allocated(context)
    hints = []
    base = _with_attention(context, "base", allocated)
    if base is None or float((base - context.reference_logits).abs().max()) > \
            _ROUNDING * max(1.0, float(context.reference_logits.abs().max())):
        return []  # our own attention does not reproduce the reference's: stay silent
    for name, what in _VARIANTS.items():
        if name == "unfilled" and allocated <= context.position + context.fed.shape[1]:
            continue
        found = _reproduces(context, _with_attention(context, name, allocated))
        if found is not None:
            hints.append(f"{what}: the same change in the reference's step reproduces the "
                         f"candidate's logits (max abs error {found[0]:.2g} vs "
                         f"{found[1]:.2g} unmodified)")
    return hints


def _allocated(context: StepContext) -> int:
    for row in context.caches:
        if "pre-allocated to " in row.layout:
            return int(row.layout.split("pre-allocated to ")[1].split(" ")[0])
    return 0


def _with_attention(context: StepContext, variant: str, allocated: int) -> torch.Tensor | None:
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return None
    with _attention_swapped(ALL_ATTENTION_FUNCTIONS, _attention(variant, allocated)):
        return _rerun(context)


@contextlib.contextmanager
def _attention_swapped(registry: Any, function: Callable[..., Any]) -> Iterator[None]:
    had = "get_interface" in vars(registry)
    saved = vars(registry).get("get_interface")
    registry.get_interface = lambda *args, **kwargs: function
    try:
        yield
    finally:
        if had:
            registry.get_interface = saved
        else:
            del registry.get_interface


def _attention(variant: str, allocated: int) -> Callable[..., Any]:
    def attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: Any, scaling: float | None = None, **_: Any) -> Any:
        heads, kv_heads = query.shape[1], key.shape[1]
        groups = heads // kv_heads
        if variant == "gqa-tiled":
            key, value = key.repeat(1, groups, 1, 1), value.repeat(1, groups, 1, 1)
        else:
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        t, s = query.shape[2], key.shape[2]
        if variant == "unfilled":
            pad = allocated - s
            key = torch.cat([key, key.new_zeros(*key.shape[:2], pad, key.shape[-1])], dim=2)
            value = torch.cat([value, value.new_zeros(*value.shape[:2], pad,
                                                      value.shape[-1])], dim=2)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = query @ key.transpose(-1, -2) * scale
        rows = torch.arange(t)[:, None]
        cols = torch.arange(key.shape[2])[None, :]
        allowed = cols <= rows if variant == "prompt-mask" else cols <= rows + (s - t)
        if variant == "unfilled":
            allowed = allowed | (cols >= s)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        output = scores.softmax(dim=-1) @ value
        return output.transpose(1, 2).contiguous(), None

    return attend


__all__ = ["StepContext", "crash_hints", "explain"]
