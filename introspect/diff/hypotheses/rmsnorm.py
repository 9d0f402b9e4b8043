"""Decoder hint: an RMSNorm (Llama) with another eps, found from the values.

The divergent node lies in a module that holds a ``weight`` and an eps
(``variance_epsilon`` or ``eps``). Its input is captured on a run of the reference; the
RMSNorm is recomputed from it (``x² mean``, ``+ eps``, ``rsqrt``, ``x · rsqrt``, ``· weight``)
and the divergent node is identified by value among those steps. The candidate's eps is then
solved from its value (where the step shows it directly) or taken from the usual ones, and
the hint is given only when recomputing with that eps reproduces the candidate's value within
budget and far better than the reference's eps. Nothing is inferred from names.
"""

from __future__ import annotations

import torch

from introspect.diff.hypotheses.context import DivergenceContext
from introspect.diff.hypotheses.tokens import real_in, real_tokens, reproduces, sentence

_USUAL_EPS = (1e-12, 1e-8, 1e-6, 1e-5, 1e-3, 1e-2, 1e-1, 0.0)


def hints(context: DivergenceContext) -> list[str]:
    """A hint when another RMSNorm eps reproduces the candidate's values; else none."""
    module = _module(context.reference_model, context.module)
    eps = _eps_of(module)
    weight = getattr(module, "weight", None)
    if module is None or eps is None or not isinstance(weight, torch.Tensor):
        return []
    x = _captured_input(context.reference_model, module, context.inputs)
    if x is None:
        return []
    base = _steps(x, weight, eps)
    keep = real_tokens(context.inputs)
    reference = context.reference_value
    step = next((name for name, value in base.items() if value.shape == reference.shape
                 and _close(value, reference.to(value.dtype), _real(value.shape, keep))),
                None)
    if step is None:
        return []
    candidate = context.candidate_value.to(base[step].dtype)
    real = _real(candidate.shape, keep)
    allowed = context.atol + context.rtol * float(candidate[real].abs().max())
    for guess in _guesses(step, x, candidate, real):
        if guess == eps or guess < 0:
            continue
        found = reproduces(_steps(x, weight, guess)[step], base[step], candidate, real, allowed)
        if found is not None:
            what = (f"the candidate's RMSNorm ({context.module}) uses eps {guess:g}, not the "
                    f"reference's {eps:g}")
            return [sentence(what, f"recomputing it with eps {guess:g}", found)]
    return []


def _real(shape: torch.Size, keep: torch.Tensor | None) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bool) if keep is None else real_in(shape, keep)


def _close(value: torch.Tensor, reference: torch.Tensor, real: torch.Tensor) -> bool:
    return torch.allclose(value[real], reference[real], atol=1e-6, rtol=1e-5)


def _steps(x: torch.Tensor, weight: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """The RMSNorm's intermediates, as HF's LlamaRMSNorm computes them (in fp32)."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)  # (B, S, 1)
    shifted = variance + eps
    scale = torch.rsqrt(shifted)
    normed = h * scale
    return {"variance + eps": shifted, "rsqrt": scale, "normed": normed,
            "output": weight * normed.to(x.dtype)}


def _guesses(step: str, x: torch.Tensor, candidate: torch.Tensor,
             real: torch.Tensor) -> list[float]:
    """The eps the candidate's value says (at real tokens), rounded to one digit, then the
    usual ones."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    solved = None
    if step == "variance + eps":
        solved = float((candidate - variance)[real].median())
    elif step == "rsqrt":
        solved = float((candidate.pow(-2) - variance)[real].median())
    guesses = [float(f"{solved:.0e}")] if solved is not None and solved > 0 else []
    return guesses + list(_USUAL_EPS)


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return model.get_submodule(path) if path else None
    except AttributeError:
        return None


def _eps_of(module: torch.nn.Module | None) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float) and not isinstance(module, torch.nn.LayerNorm):
            return value
    return None


def _captured_input(model: torch.nn.Module, module: torch.nn.Module,
                    inputs: dict[str, torch.Tensor] | object) -> torch.Tensor | None:
    """The first input of ``module`` on a run of ``model`` (its first call)."""
    captured: list[torch.Tensor] = []

    def keep(_: torch.nn.Module, args: tuple[object, ...]) -> None:
        if not captured and args and isinstance(args[0], torch.Tensor):
            captured.append(args[0].detach())

    handle = module.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            model(**inputs)  # type: ignore[arg-type]
    finally:
        handle.remove()
    return captured[0] if captured else None


__all__ = ["hints"]
