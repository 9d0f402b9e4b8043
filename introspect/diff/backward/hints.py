"""Known training bugs, recognised on the values of two gradients.

Each test reads the candidate's and the reference's gradient of one node or weight (the
candidate's already in the reference's layout) and says what it sees; nothing is
guessed from names:

- exactly zero on one side only: the graph is cut there (``detach()``, ``.data``,
  ``torch.no_grad()``, an op without a gradient);
- a constant multiple of the other: a scale applied outside the graph or only in one
  direction (loss scaling left in, a mean against a sum, ``1/sqrt(d)`` in one pass only);
- a share of elements zeroed and the rest scaled by ``1/(1-p)``: dropout active on one
  side only;
- non-zero where the reference's is exactly zero along whole token rows: gradient
  flowing into padded positions or into labels the loss should ignore;
- a weight whose gradient is the sum of two of the candidate's: tied weights copied
  (``untied_hint``).
"""

from __future__ import annotations

import math

import torch

_RESIDUAL = 1e-3  # a fit this close (relative to the gradient's size) is "exactly"


def gradient_hints(cand: torch.Tensor, ref: torch.Tensor, pad: torch.Tensor | None, *,
                   cut: bool = False, where: str = "the gradient",
                   weight: bool = False) -> list[str]:
    """What the difference between two gradients looks like (most telling first)."""
    a, b = cand.double(), ref.double()
    if a.shape != b.shape or a.numel() == 0:
        return []
    hints: list[str] = []
    ref_zero, cand_zero = not bool(b.any()), not bool(a.any())
    if cand_zero and not ref_zero:
        how = " (no gradient reached it at all)" if cut else ""
        hints.append(f"{where} is exactly zero in the candidate and not in the reference"
                     f"{how}: {CUT} (detach(), .data, torch.no_grad"
                     "(), an op without a gradient, or a tensor autograd saved changed in place)")
        return hints
    if ref_zero and not cand_zero:
        hints.append(f"{where} is exactly zero in the reference and not in the candidate: the "
                     "reference cuts the graph here (detached) and the candidate does not")
        return hints
    if weight and b.ndim == 2:
        never = ~b.bool().any(dim=1) & a.bool().any(dim=1)
        if bool(never.any()):
            found = never.nonzero().flatten().tolist()
            hints.append(f"{where} reaches row(s) {', '.join(map(str, found[:4]))} in the "
                         "candidate, which the reference's never does: an embedding looked up "
                         "without its padding_idx (the pad token's row trains), or rows the "
                         "reference freezes")
    rows = None if weight else _zero_rows(b)
    if rows is not None and bool(rows.any()):
        leaked = a.reshape(rows.numel(), -1)[rows.reshape(-1)].abs().max()
        if float(leaked) > 0:
            what = "padded positions" if pad is not None and bool(
                pad.reshape(rows.numel(), -1)[:, 0][rows.reshape(-1)].all()) else \
                "positions the reference's loss ignores (padding or labels set to -100)"
            hints.append(f"{where} flows into {what} in the candidate (max {float(leaked):.3g}), "
                         "where the reference gives them none: a loss or mask that counts them")
    scale = _constant_scale(a, b)
    if scale is not None and not math.isclose(scale, 1.0, rel_tol=1e-2):
        hints.append(f"{where} is the reference's times {scale:.6g}: a scale applied outside "
                     f"the graph or in one direction only ({_name_scale(scale)})")
    dropout = _dropout_share(a, b)
    if dropout is not None:
        hints.append(f"{where} looks like dropout on one side only: {dropout:.0%} of it zeroed "
                     "in the candidate, the rest scaled by 1/(1-p) (a module left in training "
                     "mode, or F.dropout(training=True))")
    return hints


def untied_hint(reference: str, copies: list[str]) -> str:
    return (f"{reference} is tied in the reference (one weight, read in several places) and "
            f"copied in the candidate ({', '.join(copies)}): the copies' gradients add up to "
            "the reference's, but each is trained apart: tie them (one Parameter)")


def _zero_rows(b: torch.Tensor) -> torch.Tensor | None:
    """For a (B, S, ...) gradient: which (batch, token) rows are exactly zero."""
    if b.ndim < 2:
        return None
    rows = ~b.reshape(b.shape[0] * b.shape[1], -1).bool().any(dim=1)
    return rows.reshape(b.shape[0], b.shape[1])


def _constant_scale(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """k where a == k * b up to rounding, else None."""
    denominator = float((b * b).sum())
    if denominator == 0:
        return None
    k = float((a * b).sum()) / denominator
    if k == 0 or not math.isfinite(k):
        return None
    residual = float((a - k * b).abs().max())
    return k if residual <= _RESIDUAL * float(a.abs().max()) else None


def _name_scale(k: float) -> str:
    """Familiar scales: powers of two (loss scaling), counts (mean vs sum), square roots."""
    for x, prefix in ((k, ""), (1 / k, "1/")):
        if x <= 1:
            continue
        exponent = math.log2(x)
        if abs(exponent - round(exponent)) < 1e-6:
            return (f"{prefix}2^{round(exponent)}: loss scaling not undone, a mean where the "
                    f"other sums, or 1/sqrt({round(x * x)}) in one pass only")
        if math.isclose(x, round(x), rel_tol=1e-5):
            return f"{prefix}{round(x)}: a mean where the other sums (over {round(x)} items?)"
        if math.isclose(x * x, round(x * x), rel_tol=1e-5):
            return f"{prefix}sqrt({round(x * x)}): a 1/sqrt(d) scale in one pass only"
        dropped = 1 - 1 / x  # (1/(1-p): what dropout scales the kept values by)
        if math.isclose(dropped * 100, round(dropped * 100), abs_tol=1e-3) and dropped <= 0.9:
            p = f"{round(dropped * 100) / 100:g}"
            factor, side = (f"1/(1-{p})", "the candidate") if not prefix \
                else (f"1-{p}", "the reference")
            return (f"{factor}: dropout's scale in {side} only, nothing dropped here (a module "
                    "left in training mode, or F.dropout(training=True))")
    return "no familiar factor"


def _dropout_share(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """The share zeroed when ``a`` is ``b`` with elements dropped and the rest scaled."""
    nonzero = b != 0
    dropped = (a == 0) & nonzero
    share = float(dropped.sum()) / max(int(nonzero.sum()), 1)
    if not 0.02 <= share <= 0.9:
        return None
    kept = nonzero & ~dropped
    if not bool(kept.any()):
        return None
    ratio = a[kept] / b[kept]
    expected = 1 / (1 - share)
    if float((ratio - ratio.median()).abs().max()) > 1e-3 * float(ratio.median().abs()):
        return None
    return share if math.isclose(float(ratio.median()), expected, rel_tol=0.5) else None


__all__ = ["gradient_hints", "untied_hint"]


CUT = "the candidate cuts the graph here"  # (in the hint of a gradient no value reached)


def autograd_off_hint(module: str, grad_off: set[str]) -> str | None:
    """Where a gradient was cut at the candidate's ``module`` and that module (or one
    holding it) ran with autograd off inside the call with it on: what switched it off.
    ``grad_off``: the modules so called (``Calls.grad_off``). The outermost is named."""
    path, found = module, ""
    while path:
        if path in grad_off:
            found = path
        path = path.rpartition(".")[0]
    if not found:
        return None
    return (f"the candidate's {found} ran with autograd off inside the call with autograd on "
            "(torch.no_grad(), or torch.utils.checkpoint(use_reentrant=True), which runs its "
            "function without autograd and hands back a value with no gradient when none of "
            "its tensor inputs requires one, as token ids do): its output gets no gradient "
            "(use_reentrant=False keeps it)")
