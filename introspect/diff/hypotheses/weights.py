"""Weight bugs: transposed, reshaped instead of transposed, from another layer, unloaded, a
bias never added.

Transposed and other-layer weights are tested like every hypothesis, by re-running the
block with the suspected weight. A weight reshaped where it should have been transposed
(``w.reshape(in, out)`` for ``w.t()``) and an unloaded one are tested on the candidate's
parameters: one of them holds the reference weight's values in the reference's memory
order under another shape; none of them holds them, as they are, transposed, reshaped, or
as a block of a fused weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from functools import partial

import torch

from introspect.diff.hypotheses.blocks import READS, LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site
from introspect.spread import spread


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    for name, value in site.weights.items():
        if value.dim() == 2 and value.shape[0] == value.shape[1]:
            yield Hypothesis(f"weight {site.module(name)} is the reference's transposed",
                             "transposing it in the reference",
                             partial(run_layer, site, _with(site, name, value.t())),
                             "weights", replaces=name, changes=(site.owner_of(name),))
    for name, value in site.weights.items():
        # A bias held but never added (``x @ w.t()``, ``torch.mm``, ``bias=False``): the
        # reference run without it. A bias of zeros cannot be told from its absence.
        if name.endswith(".bias") and value.dim() == 1 and bool(value.any()):
            yield Hypothesis(f"bias {site.module(name)} is not added in the candidate",
                             "leaving it out in the reference",
                             partial(run_layer, site, _with(site, name, torch.zeros_like(value))),
                             "weights", replaces=name, changes=(site.owner_of(name),))
    for other, weights in enumerate(site.layers):
        if other == site.index:
            continue
        for name in site.weights:
            if name in weights and weights[name].shape == site.weights[name].shape:
                yield Hypothesis(f"weight {site.module(name)} holds the values of "
                                 f"encoder.layer.{other}.{name}: loaded from another layer",
                                 "loading that one in the reference",
                                 partial(run_layer, site, _with(site, name, weights[name])),
                                 "weights", replaces=name, changes=(site.owner_of(name),))


def _with(site: Site, name: str, value: torch.Tensor) -> LayerOptions:
    return LayerOptions(overrides={name: value})


def unloaded(site: Site, quantity: str, candidate: torch.nn.Module) -> list[str]:
    """Hints for reference weights read up to ``quantity`` that the candidate holds nowhere."""
    hints = []
    # (a port may hold its weights as buffers, handed to a skeleton by functional_call)
    named = {label: t.detach() for label, t in (*candidate.named_parameters(),
                                                *candidate.named_buffers())
             if t.is_floating_point()}
    params = list(named.values())
    for module in READS.get(quantity, ()):
        for kind in ("weight", "bias"):
            name = f"{module}.{kind}"
            value = site.weights.get(name)
            if value is None or value.dim() == 0 or _held(value, params):
                continue
            where = (f"encoder.layer.{site.index}." if site.kind == "layer"
                     else "pooler." if site.kind == "pooler" else "embeddings.")
            scaled = held_scaled(value, named)
            if scaled is not None:
                hints.append(scaled_hint(f"{site.prefix}{where}{name}", *scaled))
                continue
            hints.append(f"weight {site.prefix}{where}{name} has no counterpart in the "
                         "candidate (no parameter or buffer holds its values, as they are, "
                         "transposed, reshaped, or as a block of a fused weight): left "
                         "unloaded, still at its initial values")
    return hints


def reshaped(reference: torch.nn.Module, module: str,
             candidate: torch.nn.Module) -> list[str]:
    """Hints for the weights of the reference's ``module`` that a candidate's parameter
    holds rearranged by a reshape (``w.reshape(in, out)`` where ``w.t()`` was meant)."""
    try:
        weights = list(reference.get_submodule(module).named_parameters()) if module else []
    except AttributeError:
        return []
    params = dict(candidate.named_parameters())
    hints = []
    for name, value in weights:
        path = f"{module}.{name}"
        for label, p in params.items():
            expression = rearrangement(p, value, path)
            if expression is None:
                continue
            if expression == f"{path}.reshape{tuple(value.t().shape)}":
                hints.append(f"weight {path} {tuple(value.shape)} is reshaped, not transposed, "
                             f"into the candidate's {label}: it holds {expression} where "
                             f"{path}.t() was meant (the transpose's shape, the values out "
                             "of place)")
            else:
                hints.append(f"weight {path} {tuple(value.shape)} is rearranged by a reshape "
                             f"in the candidate's {label}: it holds {expression}")
    return hints


def rearrangement(p: torch.Tensor, value: torch.Tensor, path: str) -> str | None:
    """How the matrix ``p`` holds the matrix ``value`` (named ``path``) rearranged by a
    reshape, e.g. "W.reshape(128, 512)" or "W.t().reshape(512, 128)"; None when it does
    not (as it is or transposed is no reshape; a square one reshaped is itself)."""
    if p.dim() != 2 or value.dim() != 2 or p.numel() != value.numel() \
            or value.shape[0] == value.shape[1]:
        return None
    if any(p.shape == v.shape and _equal(p, v) for v in (value, value.t())):
        return None  # as it is or transposed (a constant matrix is both): no reshape
    for turned in (False, True):
        v = value.t() if turned else value
        for back in (False, True):
            q = p.t() if back else p
            if q.shape != v.shape and _equal(q.reshape(-1), v.reshape(-1)):
                return (f"{path}{'.t()' if turned else ''}.reshape{tuple(q.shape)}"
                        f"{'.t()' if back else ''}")
    return None


def _equal(p: torch.Tensor, value: torch.Tensor) -> bool:
    """Equal after rounding the reference's value to the candidate's dtype."""
    return torch.allclose(p.detach().float(), value.detach().to(p.device, p.dtype).float(),
                          rtol=1e-3, atol=1e-6)


# Head sizes whose 1/sqrt a port may fold into its weights: powers of two, multiples of 16.
_HEAD_SIZES = sorted({2 ** k for k in range(11)} | set(range(16, 513, 16)))


def scaled_hint(reference: str, candidate: str, factor: float) -> str:
    """The hint for a candidate's weight holding a reference weight times ``factor``; one
    near 1/sqrt(n) (a head size's scale folded in) says how far from it."""
    n = min(_HEAD_SIZES, key=lambda size: abs(factor * math.sqrt(size) - 1)) \
        if factor > 0 else 0
    folded = 1 / math.sqrt(n) if n else 0.0
    near = ""
    if folded and abs(factor - folded) > 1e-6 * folded and abs(factor / folded - 1) < 0.05:
        near = f", not 1/sqrt({n}) = {folded:.6g} ({factor / folded - 1:+.3g} off it)"
    return (f"weight {candidate} holds the reference's {reference} times {factor:.6g}{near}: "
            "a scale folded into it (the op that applied the scale must no longer apply it)")


def held_scaled(value: torch.Tensor, params: Mapping[str, torch.Tensor]
                ) -> tuple[str, float] | None:
    """(the parameter, the factor) where one of ``params`` holds ``value`` times a factor
    other than 1, to float32's rounding (1/sqrt(d) folded into a query's weights), or None."""
    for label, p in params.items():
        factor = scale_between(p, value)
        if factor is not None:
            return label, factor
    return None


def scale_between(p: torch.Tensor, value: torch.Tensor) -> float | None:
    """The factor ``a`` (not 0 or 1) for which ``p`` is ``a * value`` to rounding, or None:
    read first at a few elements (most pairs part there, with no copy of either), then in
    full, in float64."""
    if p.shape != value.shape or not p.is_floating_point() or not value.is_floating_point() \
            or value.numel() < 2:
        return None
    v, q = value.detach().reshape(-1), p.detach().reshape(-1)
    picks = spread(len(v), 16, v.device)
    few, theirs = v[picks].double().cpu(), q[picks.to(q.device)].double().cpu()
    factor = _factor(few, theirs)
    if factor is None:
        return None
    whole, mine = v.double().cpu(), q.double().cpu()
    tolerance = 1e-6 * abs(factor) * float(whole.abs().max())  # (float32's rounding, a few)
    return factor if torch.allclose(mine, factor * whole, rtol=1e-5, atol=tolerance) else None


def _factor(value: torch.Tensor, scaled: torch.Tensor) -> float | None:
    """The factor ``scaled`` holds ``value`` times, read at their largest element, where
    every element agrees with it (None: no such factor other than 0 or 1)."""
    largest = int(value.abs().argmax())
    if value[largest] == 0:
        return None
    factor = float(scaled[largest] / value[largest])
    if factor == 0 or not math.isfinite(factor) or abs(factor - 1) < 1e-6:
        return None
    tolerance = 1e-6 * abs(factor) * float(value[largest].abs())
    return factor if torch.allclose(scaled, factor * value, rtol=1e-5, atol=tolerance) \
        else None


def _held(value: torch.Tensor, params: Iterable[torch.Tensor]) -> bool:
    reference = value
    for p in _with_slices(params, value.dim()):
        if rearrangement(p, reference, "") is not None:
            return True  # loaded, wrongly: ``reshaped`` says how
        # Compared after rounding the reference's weight to the candidate's dtype: a
        # bfloat16 copy holds the same weights, rounded.
        value = reference.to(p.device, p.dtype).float()  # a candidate on its own device
        p = p.float()
        for view in (p, p.t()) if p.dim() == 2 else (p,):
            if view.dim() != value.dim() or view.numel() < value.numel():
                continue
            if value.dim() == 1:
                blocks = [view[i:i + len(value)] for i in range(0, len(view) - len(value) + 1,
                                                                len(value))]
            elif view.shape[1] == value.shape[1] and view.shape[0] % value.shape[0] == 0:
                blocks = list(view.split(value.shape[0]))
            elif view.shape[0] == value.shape[0] and view.shape[1] % value.shape[1] == 0:
                blocks = list(view.split(value.shape[1], dim=1))
            else:
                continue
            if any(b.shape == value.shape and torch.allclose(b, value, rtol=1e-3, atol=1e-6)
                   for b in blocks):
                return True
    parts = list(_with_slices(params, 2)) + list(_with_slices(params, 1))  # (a head's)
    return reference.dim() in (1, 2) and _held_in_parts(reference, parts) \
        or reference.dim() == 2 and any(_rows_permuted(reference, p) for p in params)


def _rows_permuted(value: torch.Tensor, p: torch.Tensor) -> bool:
    """Matrix ``p`` holds ``value``'s rows, or its columns, in another order (an FFN's
    hidden units in another order: its input Linear's rows, its output's columns)."""
    if p.dim() != 2 or p.shape != value.shape:
        return False
    mine, theirs = p.detach().float().cpu(), value.detach().float().cpu()
    for a, b in ((mine, theirs), (mine.t(), theirs.t())):
        key = torch.linspace(1.0, 2.0, a.shape[1])  # one number per row, order-blind
        a, b = a[(a @ key).argsort()], b[(b @ key).argsort()]
        if torch.allclose(a, b, rtol=1e-3, atol=1e-6):
            return True
    return False


def _held_in_parts(value: torch.Tensor, params: Iterable[torch.Tensor]) -> bool:
    """Matrix or vector ``value`` held whole by blocks of its rows (its elements), or of
    its columns, in several of ``params`` (as they are or transposed): one Linear per
    head, an einsum's (heads, head size, hidden) weight, an FFN's output Linear split in
    two halves of its inputs. Not "left unloaded"."""
    if value.dim() == 1:
        value, params = value[:, None], [p[:, None] for p in params if p.dim() == 1]
    pieces = [p.detach().float() for p in params if p.dim() == 2]
    for matrix in (value, value.t()) if value.shape[1] > 1 else (value,):  # rows, columns
        matrix = matrix.float()
        covered = torch.zeros(matrix.shape[0], dtype=torch.bool)
        for p in pieces:
            for view in (p, p.t()):
                rows = view.shape[0]
                if view.shape[1] != matrix.shape[1] or rows >= matrix.shape[0]:
                    continue
                same = torch.isclose(matrix.to(view.device), view[0], rtol=1e-3,
                                     atol=1e-6).all(1).nonzero().flatten().tolist()
                for start in same:
                    block = matrix[start:start + rows].to(view.device)
                    if block.shape == view.shape and torch.allclose(block, view, rtol=1e-3,
                                                                    atol=1e-6):
                        covered[start:start + rows] = True
                        break
        if bool(covered.all()):
            return True
    return False


def _with_slices(params: Iterable[torch.Tensor], dim: int) -> Iterator[torch.Tensor]:
    """Each parameter, and the slices of one stacked along a leading layer axis (a port
    after a JAX scan holds ``wo`` as (layers, H, H)) where the value has ``dim`` axes."""
    for p in params:
        yield p
        if p.dim() == dim + 1:
            yield from p.unbind(0)
