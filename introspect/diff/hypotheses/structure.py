"""Structural bugs: a residual left out, pre-LN instead of post-LN, layers out of order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import partial

import torch

from introspect.diff.hypotheses.blocks import LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    yield Hypothesis("the candidate leaves out the attention block's residual connection "
                     "(LayerNorm(attention) instead of LayerNorm(x + attention))",
                     "dropping that residual in the reference",
                     lambda: run_layer(site, LayerOptions(attention_residual=False)), "residual",
                     changes=(site.module("attention.output"),))
    yield Hypothesis("the candidate leaves out the feed-forward block's residual connection",
                     "dropping that residual in the reference",
                     lambda: run_layer(site, LayerOptions(output_residual=False)), "residual",
                     changes=(site.module("output"),))
    yield Hypothesis("the candidate's layer is pre-LN (x + f(LayerNorm(x))) where BERT is "
                     "post-LN (LayerNorm(x + f(x)))", "computing the reference's layer pre-LN",
                     lambda: run_layer(site, LayerOptions(pre_ln=True)), "structure")
    readers = tuple(dict.fromkeys(site.owner_of(name) for name in site.weights))
    for other, weights in enumerate(site.layers):
        if other != site.index:
            yield Hypothesis(f"layers out of order: the candidate's encoder.layer.{site.index} "
                             f"computes with encoder.layer.{other}'s weights",
                             f"running the reference's layer {other} in its place",
                             partial(run_layer, site, weights=weights), "order",
                             changes=readers)
    # Weights pair each layer with its own: a layer run out of turn shows as a layer fed
    # the output of one that the reference runs after it.
    outputs: list[torch.Tensor] = []  # shared by these hypotheses: each layer runs once
    for later in range(site.index + 1, len(site.layers)):
        yield Hypothesis(f"layers out of order: the candidate runs encoder.layer.{later} "
                         f"before encoder.layer.{site.index}, which reads its output",
                         f"feeding the reference's layer {site.index} with the output of its "
                         f"layer {later}", partial(_fed_by, site, later, outputs), "order",
                         changes=(f"{site.prefix}encoder",))  # what the encoder hands on


def _fed_by(site: Site, later: int, outputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The layer at ``site`` run on the reference's output of layer ``later`` (> index).

    ``outputs[j]`` is the output of layer index + j on the site's input, computed on
    first need from the one before it, as the reference chains them.
    """
    whole = dataclasses.replace(site, stop=None)  # the layers before it: their output is read
    while len(outputs) <= later - site.index:
        x = outputs[-1] if outputs else site.block_input
        layer = site.layers[site.index + len(outputs)]
        outputs.append(run_layer(whole, weights=layer, block_input=x)["layer_output"])
    return run_layer(site, block_input=outputs[later - site.index])
