"""Embedding bugs: position ids shifted, token-type embeddings left out or added twice."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from introspect.diff.hypotheses.hypothesis import Hypothesis, run_embeddings
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "embeddings":
        return
    for offset in (1, -1, 2):
        if site.input_ids.shape[-1] + max(offset, 0) <= len(
                site.weights["position_embeddings.weight"]) and offset:
            yield Hypothesis(f"the candidate's position ids are offset by {offset:+d}",
                             f"looking positions up at {offset:+d} in the reference",
                             partial(run_embeddings, site, position_offset=offset),
                             "embeddings")
    yield Hypothesis("the candidate leaves out the token type (segment) embeddings",
                     "dropping them from the reference's sum",
                     lambda: run_embeddings(site, token_type_uses=0), "embeddings")
    yield Hypothesis("the candidate adds the token type (segment) embeddings twice",
                     "adding them twice in the reference",
                     lambda: run_embeddings(site, token_type_uses=2), "embeddings")
