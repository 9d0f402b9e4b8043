"""Head-by-head parity: which attention head of which layer parts from the reference.

Both models run on the same inputs (each on its own, as a user runs them); the attention
probabilities of every head are compared on the real tokens. A head diverges when some
weight is off by more than the budget of the dtype they are compared in
(``|cand - ref| <= atol + rtol * |ref|``). The first divergent head, in layer then head
order, is where to look: a port with the query rows of two heads swapped parts exactly
at the first of those heads, while every head of the layers before agrees.

Example::

    >>> parity = introspect.attention.compare_heads(hf_model, port, inputs)
    >>> parity.first_divergence
    (1, 3)
    >>> parity.frame().head(3)          # layer, head, max_abs_err, passed
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from introspect.attention.maps import AttentionMaps, attention
from introspect.diff.tolerance import Budget, Tolerance, compare_dtype
from introspect.errors import InputError
from introspect.models.load import TokenizedInputs

if TYPE_CHECKING:
    import pandas


@dataclass
class HeadParity:
    """The attention of a candidate compared with a reference's, head by head.

    Attributes:
        reference, candidate: the two models' attention maps.
        max_abs_err: ``(layers, heads)`` largest |difference| over real tokens.
        passed: ``(layers, heads)`` bool, every weight within ``budget``.
        budget: the error budget of the dtype the maps are compared in.
    """

    reference: AttentionMaps
    candidate: AttentionMaps
    max_abs_err: torch.Tensor
    passed: torch.Tensor
    budget: Budget

    @property
    def first_divergence(self) -> tuple[int, int] | None:
        """(layer, head) of the first head over budget, in layer then head order."""
        failing = (~self.passed).nonzero()
        if not len(failing):
            return None
        layer, head = failing[0].tolist()
        return int(layer), int(head)

    @property
    def all_passed(self) -> bool:
        return bool(self.passed.all())

    def worst_row(self, layer: int, head: int) -> int:
        """The batch row where head (layer, head) differs most (the one to draw)."""
        diff = (self.candidate.probs[layer, :, head] - self.reference.probs[layer, :, head]).abs()
        real = self.reference.keep[:, :, None] & self.reference.keep[:, None, :]
        return int((diff * real).amax(dim=(1, 2)).argmax())

    def frame(self) -> pandas.DataFrame:
        """One row per (layer, head): max_abs_err and passed."""
        import pandas as pd

        L, nh = self.max_abs_err.shape
        return pd.DataFrame({
            "layer": [layer for layer in range(L) for _ in range(nh)],
            "head": [head for _ in range(L) for head in range(nh)],
            "max_abs_err": [float(v) for v in self.max_abs_err.reshape(-1)],
            "passed": [bool(v) for v in self.passed.reshape(-1)],
        })

    def csv(self) -> str:
        """The per-head table as CSV text (errors in 6 significant digits, stable)."""
        lines = ["layer,head,max_abs_err,passed"]
        for row in self.frame().itertuples(index=False):
            lines.append(f"{row.layer},{row.head},{row.max_abs_err:.6g},"
                         f"{'true' if row.passed else 'false'}")
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One line: every head within budget, or the first that is not."""
        L, nh = self.max_abs_err.shape
        worst = float(self.max_abs_err.max())
        first = self.first_divergence
        if first is None:
            return (f"attention heads: all {L}x{nh} heads within budget "
                    f"(max abs error {worst:.3g})")
        layer, head = first
        failing = int((~self.passed).sum())
        return (f"attention heads: first divergent head: layer {layer}, head {head} "
                f"(max abs error {float(self.max_abs_err[layer, head]):.3g} over budget "
                f"{self.budget}); {failing} of {L * nh} heads over budget")

    def svg(self, layer: int | None = None, head: int | None = None) -> str:
        """Side-by-side heatmaps of one head: reference, candidate and their difference.

        Defaults to the first divergent head (or layer 0, head 0 when all agree), drawn
        for the batch row where it differs most.
        """
        from introspect.attention.views import parity_svg

        if layer is None or head is None:
            layer, head = self.first_divergence or (0, 0)
        self.reference.check(layers=[layer], heads=[head])
        return parity_svg(self, layer, head, self.worst_row(layer, head))


def compare_heads(reference: torch.nn.Module, candidate: torch.nn.Module,
                  inputs: TokenizedInputs | Mapping[str, torch.Tensor], *,
                  atol: float | None = None, rtol: float | None = None) -> HeadParity:
    """Compare the attention probabilities of two models head by head.

    Args:
        reference: the trusted model (e.g. HF BERT, sdpa or eager).
        candidate: the model checked (a port, another dtype or attention kernel).
        inputs: ``introspect.tokenize(...)`` output or a mapping of tensors by name.
        atol, rtol: override the budget (default: per dtype, as ``introspect.diff``).

    Returns:
        A ``HeadParity``: per-head errors, the first divergent head, a heatmap of it.

    Raises:
        InputError: the two models differ in the number of layers, heads or tokens.
        TraceError: either model cannot be traced or holds no attention.
    """
    ref = attention(reference, inputs, title="reference")
    cand = attention(candidate, inputs, title="candidate")
    if ref.probs.shape != cand.probs.shape:
        raise InputError(
            f"cannot compare attention head by head: the reference has "
            f"{ref.num_layers} layers x {ref.num_heads} heads over {ref.probs.shape[-1]} "
            f"tokens, the candidate {cand.num_layers} x {cand.num_heads} over "
            f"{cand.probs.shape[-1]}")
    dtype = compare_dtype(_dtype_name(reference), _dtype_name(candidate))
    budget = Tolerance(atol=atol, rtol=rtol).budget(dtype)
    real = (ref.keep[:, :, None] & ref.keep[:, None, :])[None, :, None]  # (1, B, 1, S, S)
    diff = (cand.probs - ref.probs).abs() * real
    allowed = budget.atol + budget.rtol * ref.probs.abs()
    max_abs_err = diff.amax(dim=(1, 3, 4))  # (L, nh)
    passed = ~((diff > allowed) & real).any(dim=(1, 3, 4))
    return HeadParity(ref, cand, max_abs_err, passed, budget)


def _dtype_name(model: torch.nn.Module) -> str:
    """The floating dtype of the model's parameters (float32 when it has none)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return str(parameter.dtype).removeprefix("torch.")
    return "float32"
