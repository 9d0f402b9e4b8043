"""Weights stored in a lower precision than the reference's, and upcast to compute.

A port may keep its parameters in bfloat16 or float16 (to halve its memory) and cast them
up inside forward: it computes in float32, so no dtype differs at the divergent node, yet
every weight it reads was rounded once. Where the candidate holds floating parameters of
such a dtype and the reference's are wider, the block is run again on its weights rounded
to that dtype and back, and judged like any hypothesis."""

from __future__ import annotations

import dataclasses

import torch

from introspect.diff.hypotheses.hypothesis import run_base
from introspect.diff.hypotheses.matching import Judge, Quantity
from introspect.diff.hypotheses.site import Site

_LOWER = (torch.bfloat16, torch.float16)


def stored_dtype_hints(site: Site, quantity: Quantity, candidate_model: torch.nn.Module | None,
                       judge: Judge) -> list[str]:
    """The hint where the block's weights rounded to a lower dtype the candidate stores
    parameters in reproduce its value ([] where none does)."""
    if candidate_model is None:
        return []
    held = {p.dtype for p in candidate_model.parameters() if p.dtype in _LOWER}
    hints = []
    for dtype in sorted(held, key=str):
        wider = {name: w for name, w in site.weights.items()
                 if w.is_floating_point() and w.element_size() > dtype.itemsize}
        if not wider:
            continue
        rounded = {**site.weights, **{name: w.to(dtype).to(w.dtype) for name, w in wider.items()}}
        try:
            value = run_base(dataclasses.replace(site, weights=rounded, linears=None))
            verdict = judge(quantity.layout(value[quantity.name]))
        except (RuntimeError, KeyError):
            continue
        if verdict is not None:
            name = str(dtype).removeprefix("torch.")
            hints.append(f"the candidate stores its weights in {name} and computes with them "
                         f"upcast: the reference's weights rounded to {name} reproduce the "
                         f"candidate's values (max abs error {verdict.error:.2g} vs "
                         f"{verdict.base_error:.2g} unmodified)")
    return hints


__all__ = ["stored_dtype_hints"]
