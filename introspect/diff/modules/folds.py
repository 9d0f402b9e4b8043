"""A reference bias the candidate holds folded into a later Linear's bias.

A value projection's bias passes through attention as it is (each row of attention
weights sums to 1), so a port may drop it and add ``W_o @ b_v`` to the output
projection's bias instead: ``b_o' = b_o + W_o @ b_v``. The port's value Linear then
computes the reference's less ``b_v``, and its output projection the reference's. Such
a fold is proven by value: a candidate vector equal to ``b + W @ bias`` for a reference
Linear ``(W, b)`` taking as many features as ``bias`` holds, within float32's rounding of
that sum (probe round s: a correct port failed at its value Linear by ``|b_v|``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Mapping, Sequence

import torch

# A float32 sum of n products rounds by at most n units of its terms' magnitude.
_UNIT = 2.0 ** -23


def folded_onward(bias: torch.Tensor, linears: Sequence[tuple[str, torch.Tensor, torch.Tensor]],
                  vectors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, str] | None:
    """(the candidate vector's label, the later reference Linear's bias label) where a
    candidate vector holds ``b + W @ bias`` for one of the reference's ``linears``
    (bias label, W, b); None where none does, or ``bias`` is all zeros (nothing folded)."""
    if bias.ndim != 1 or not bool(bias.any()):
        return None
    shift = bias.detach().double()
    held = [(label, t) for label, t in vectors if t.ndim == 1 and t.is_floating_point()
            and t.shape[0] > 0]
    for later, matrix, base in linears:
        if matrix.ndim != 2 or matrix.shape[1] != shift.shape[0] \
                or base.shape != (matrix.shape[0],):
            continue
        w = matrix.detach().double().to(shift.device)
        b = base.detach().double().to(shift.device)
        folded = b + w @ shift
        slack = w.shape[1] * _UNIT * (b.abs() + w.abs() @ shift.abs())
        for label, t in held:
            if t.shape == folded.shape and bool(
                    ((t.detach().double().to(folded.device) - folded).abs() <= slack).all()):
                return label, later
    return None


def linears_of(model: torch.nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(bias path, weight, bias) of each of ``model``'s modules holding one weight matrix
    and one bias vector as long as its output (an ``nn.Linear``)."""
    found = []
    for name, module in model.named_modules():
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        if isinstance(weight, torch.Tensor) and isinstance(bias, torch.Tensor) \
                and weight.ndim == 2 and bias.ndim == 1 and bias.shape[0] == weight.shape[0] \
                and weight.is_floating_point():
            found.append((f"{name}.bias" if name else "bias", weight, bias))
    return found


def folded_biases(reference: torch.nn.Module, candidate: torch.nn.Module,
                  unheld: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Of the reference's biases named in ``unheld`` (no candidate parameter holds them),
    those the candidate holds folded into a later bias: bias -> (candidate vector, the
    later reference bias)."""
    wanted = set(unheld)
    if not wanted:
        return {}
    linears = linears_of(reference)
    values = dict(reference.named_parameters())
    vectors = [(n, p) for n, p in candidate.named_parameters() if p.ndim == 1]
    found = {}
    for name in sorted(wanted):
        value = values.get(name)
        fold = None if value is None else folded_onward(
            value, [lin for lin in linears if lin[0] != name], vectors)
        if fold is not None:
            found[name] = fold
    return found


def exact_values(reference: torch.nn.Module, candidate: torch.nn.Module,
                 found: Mapping[str, tuple[str, str]]) -> dict[int, torch.Tensor]:
    """Each folded candidate vector's exact value in float64 (``b + W @ bias`` from the
    reference's own), by its storage: what a float64 run puts in its place. The vector
    holds that sum rounded to float32 once, proven within that rounding: a holder run in
    float64 on it would differ from the reference's by that rounding alone, and could
    never show that what it holds cancels (a key without its bias beside a folded value
    bias: probe round s)."""
    values = dict(reference.named_parameters())
    exact = {}
    for bias, (label, later) in found.items():
        owner = later.rpartition(".")[0]
        matrix = values.get(f"{owner}.weight" if owner else "weight")
        try:
            held = candidate.get_parameter(label)
        except AttributeError:
            continue
        if matrix is None:
            continue
        exact[held.untyped_storage().data_ptr()] = (
            values[later].detach().double() + matrix.detach().double() @
            values[bias].detach().double()).to(held.device)
    return exact


_EXACT: contextvars.ContextVar[Mapping[int, torch.Tensor] | None] = \
    contextvars.ContextVar("introspect_exact_folds", default=None)


@contextlib.contextmanager
def exactly(values: Mapping[int, torch.Tensor]) -> Iterator[None]:
    """Float64 runs (``precise``) take ``values`` (``exact_values``) in place of the
    vectors they stand for, meanwhile."""
    token = _EXACT.set(values)
    try:
        yield
    finally:
        _EXACT.reset(token)


def exact_in_float64(storage: int) -> torch.Tensor | None:
    """The exact float64 value of the folded vector at ``storage``, where one is set."""
    values = _EXACT.get()
    return None if values is None else values.get(storage)


__all__ = ["exact_in_float64", "exact_values", "exactly", "folded_biases", "folded_onward",
           "linears_of"]
