"""A hypothesis: a named variant of the divergent block, and the runner of the block."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from introspect.diff.hypotheses.blocks import LayerOptions, embeddings, encoder_layer, pooler
from introspect.diff.hypotheses.site import Site


@dataclass(frozen=True)
class Hypothesis:
    """``what`` differs in the candidate, ``how`` the reference was changed to test it."""

    what: str  # "keys and values are swapped in the candidate's attention"
    how: str  # "swapping them in the reference"
    run: Callable[[], dict[str, torch.Tensor]]  # the block's intermediates under the variant
    family: str = ""  # e.g. "attention"; hypotheses of one family exclude one another
    # each row of the batch computed from its own inputs alone (False: the variant mixes
    # rows, so a few rows cannot stand for the batch: ``hypotheses._pruned`` keeps it)
    by_row: bool = True
    # the block's weight the variant replaces ("output.dense.weight"), if that is all it
    # changes: a quantity computed before anything reads it cannot move
    replaces: str = ""
    # the reference's modules (full paths) in whose own code the variant's change sits (a
    # weight replaced: the module reading it; a mask's fill: the self-attention); empty:
    # not said, it may be anywhere. Where the candidate's value was computed by one module
    # alone on the reference's values, a change in no module inside that one cannot be
    # what the candidate computes differently there (``hypotheses._by_scope``)
    changes: tuple[str, ...] = ()


def run_layer(site: Site, options: LayerOptions | None = None,
              weights=None, block_input: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The encoder layer at ``site`` under ``options`` (and other ``weights`` or input),
    up to ``site.stop``."""
    x = site.block_input if block_input is None else block_input
    assert x is not None
    return encoder_layer(site.weights if weights is None else weights, x, site.keep,
                         site.heads, site.eps, site.activation, options or LayerOptions(),
                         stop=site.stop, linear=site.linears or F.linear)


def run_embeddings(site: Site, **options) -> dict[str, torch.Tensor]:
    return embeddings(site.weights, site.input_ids, site.token_type_ids, site.embeddings_eps,
                      **options)


def run_pooler(site: Site, **options) -> dict[str, torch.Tensor]:
    assert site.block_input is not None
    return pooler(site.weights, site.block_input, site.keep, **options)


def run_base(site: Site) -> dict[str, torch.Tensor]:
    """The block as the reference computes it (its Linears recorded in ``site.linears``)."""
    if site.kind == "layer":
        if site.linears is None:
            return run_layer(site)
        with site.linears.recording():
            return run_layer(site)
    if site.kind == "embeddings":
        return run_embeddings(site)
    return run_pooler(site)
