"""Attention bugs: projections swapped, the mask, the softmax's dim, the scale."""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial

from introspect.diff.hypotheses.blocks import LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site

_FILLS = (-1.0, -2.0, -5.0, -10.0, -100.0, -1e4, -1e9, 1.0)
_NAMES = {"query": "queries", "key": "keys", "value": "values"}


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    attention = site.module("attention.self")  # where HF masks, scales and softmaxes
    masking = (attention, site.prefix.rstrip("."))  # the mask built in the body's own code
    for a, b in (("query", "key"), ("key", "value"), ("query", "value")):
        yield Hypothesis(f"{_NAMES[a]} and {_NAMES[b]} are swapped in the candidate's "
                         f"attention (its {a} projection holds the reference's {b} weights)",
                         "swapping them in the reference",
                         partial(run_layer, site, LayerOptions(swap=(a, b))), "attention",
                         changes=(attention, site.module(f"attention.self.{a}"),
                                  site.module(f"attention.self.{b}")))
    yield Hypothesis("the candidate does not apply the attention mask",
                     "leaving the mask out of the reference",
                     lambda: run_layer(site, LayerOptions(mask="none")), "mask",
                     changes=masking)
    yield Hypothesis("the candidate applies the attention mask on the query axis instead of "
                     "the key axis", "masking the padded queries' rows in the reference",
                     lambda: run_layer(site, LayerOptions(mask="query")), "mask",
                     changes=masking)
    yield Hypothesis("the candidate masks each head with another row's padding (the mask "
                     "repeated per head with repeat() where the heads were folded into the "
                     "batch row by row, which needs repeat_interleave())",
                     "masking the reference's heads so",
                     lambda: run_layer(site, LayerOptions(mask="repeat")), "mask",
                     by_row=False, changes=masking)
    for fill in _FILLS:
        for added in (True, False):
            yield Hypothesis(
                f"the attention mask's fill value differs: the candidate "
                f"{'adds' if added else 'sets'} {fill:g} at padded keys instead of the "
                "dtype's minimum",
                f"{'adding' if added else 'setting'} {fill:g} in the reference",
                partial(run_layer, site, LayerOptions(fill=fill, fill_added=added)),
                "mask", changes=masking)
    yield Hypothesis("the candidate's softmax runs over the query axis (dim -2) instead of "
                     "the key axis (dim -1)", "taking the reference's softmax over dim -2",
                     lambda: run_layer(site, LayerOptions(softmax_dim=-2)), "softmax",
                     changes=(attention,))
    hd = site.block_input.shape[-1] // site.heads if site.block_input is not None else 1
    for scale, words in ((1.0 / hd, f"1/d = 1/{hd}"), (1.0, "1 (no scaling)"),
                         (1.0 / math.sqrt(site.block_input.shape[-1] if site.block_input
                                          is not None else 1), "1/sqrt(hidden size)")):
        yield Hypothesis(f"the attention scale differs: the candidate multiplies q·kᵀ by "
                         f"{words} instead of 1/sqrt(d) = 1/sqrt({hd})",
                         "scaling the reference's scores so",
                         partial(run_layer, site, LayerOptions(scale=scale)), "scale",
                         changes=(attention,))
