"""Weight bugs: transposed, reshaped instead of transposed, from another layer, unloaded.

Transposed and other-layer weights are tested like every hypothesis, by re-running the
block with the suspected weight. A weight reshaped where it should have been transposed
(``w.reshape(in, out)`` for ``w.t()``) and an unloaded one are tested on the candidate's
parameters: one of them holds the reference weight's values in the reference's memory
order under another shape; none of them holds them, as they are, transposed, reshaped, or
as a block of a fused weight.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial

import torch

from introspect.diff.hypotheses.blocks import READS, LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    for name, value in site.weights.items():
        if value.dim() == 2 and value.shape[0] == value.shape[1]:
            yield Hypothesis(f"weight {_path(site, name)} is the reference's transposed",
                             "transposing it in the reference",
                             partial(run_layer, site, _with(site, name, value.t())),
                             "weights", replaces=name)
    for other, weights in enumerate(site.layers):
        if other == site.index:
            continue
        for name in site.weights:
            if name in weights and weights[name].shape == site.weights[name].shape:
                yield Hypothesis(f"weight {_path(site, name)} holds the values of "
                                 f"encoder.layer.{other}.{name}: loaded from another layer",
                                 "loading that one in the reference",
                                 partial(run_layer, site, _with(site, name, weights[name])),
                                 "weights", replaces=name)


def _with(site: Site, name: str, value: torch.Tensor) -> LayerOptions:
    return LayerOptions(overrides={name: value})


def _path(site: Site, name: str) -> str:
    return f"{site.prefix}encoder.layer.{site.index}.{name}"


def unloaded(site: Site, quantity: str, candidate: torch.nn.Module) -> list[str]:
    """Hints for reference weights read up to ``quantity`` that the candidate holds nowhere."""
    hints = []
    params = [p.detach() for p in candidate.parameters()]
    for module in READS.get(quantity, ()):
        for kind in ("weight", "bias"):
            name = f"{module}.{kind}"
            value = site.weights.get(name)
            if value is None or value.dim() == 0 or _held(value, params):
                continue
            where = (f"encoder.layer.{site.index}." if site.kind == "layer"
                     else "pooler." if site.kind == "pooler" else "embeddings.")
            hints.append(f"weight {site.prefix}{where}{name} has no counterpart in the "
                         "candidate (no parameter holds its values, as they are, transposed, "
                         "reshaped, or as a block of a fused weight): left unloaded, still at "
                         "its initial values")
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


def _held(value: torch.Tensor, params: Iterable[torch.Tensor]) -> bool:
    reference = value
    for p in params:
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
    return False
