"""Structural bugs: a residual left out, pre-LN instead of post-LN, layers out of order."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from introspect.diff.hypotheses.blocks import LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    yield Hypothesis("the candidate leaves out the attention block's residual connection "
                     "(LayerNorm(attention) instead of LayerNorm(x + attention))",
                     "dropping that residual in the reference",
                     lambda: run_layer(site, LayerOptions(attention_residual=False)), "residual")
    yield Hypothesis("the candidate leaves out the feed-forward block's residual connection",
                     "dropping that residual in the reference",
                     lambda: run_layer(site, LayerOptions(output_residual=False)), "residual")
    yield Hypothesis("the candidate's layer is pre-LN (x + f(LayerNorm(x))) where BERT is "
                     "post-LN (LayerNorm(x + f(x)))", "computing the reference's layer pre-LN",
                     lambda: run_layer(site, LayerOptions(pre_ln=True)), "structure")
    for other, weights in enumerate(site.layers):
        if other != site.index:
            yield Hypothesis(f"layers out of order: the candidate's encoder.layer.{site.index} "
                             f"computes with encoder.layer.{other}'s weights",
                             f"running the reference's layer {other} in its place",
                             partial(run_layer, site, weights=weights), "order")
