"""LayerNorm bugs: another epsilon, the unbiased variance."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from introspect.diff.hypotheses.blocks import LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_embeddings, run_layer
from introspect.diff.hypotheses.site import Site

_EPS = (1e-5, 1e-6, 1e-3, 1e-8, 1e-7, 1e-4, 1e-2, 1e-12)
_WHERE = ("attention.output.LayerNorm", "output.LayerNorm")


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind == "embeddings":
        for eps in _EPS:
            if eps != site.embeddings_eps:
                yield Hypothesis(f"LayerNorm eps differs in embeddings.LayerNorm: reference "
                                 f"{site.embeddings_eps:g}, candidate {eps:g}",
                                 f"using eps {eps:g} in the reference",
                                 partial(run_embeddings, site, ln_eps=eps), "norm",
                                 changes=(site.module("LayerNorm"),))
        yield Hypothesis("the candidate's LayerNorm (embeddings.LayerNorm) divides by the "
                         "unbiased variance (n - 1)", "using the unbiased variance in the "
                         "reference", lambda: run_embeddings(site, unbiased=True), "norm",
                         changes=(site.module("LayerNorm"),))
        return
    if site.kind != "layer":
        return
    for i, where in enumerate(_WHERE):
        for eps in _EPS:
            if eps == site.eps:
                continue
            pair = (eps, None) if i == 0 else (None, eps)
            yield Hypothesis(f"LayerNorm eps differs in {where}: reference {site.eps:g}, "
                             f"candidate {eps:g}", f"using eps {eps:g} in the reference",
                             partial(run_layer, site, LayerOptions(eps=pair)), "norm",
                             changes=(site.module(where),))
        flags = (True, False) if i == 0 else (False, True)
        yield Hypothesis(f"the candidate's LayerNorm ({where}) divides by the unbiased variance "
                         "(n - 1) instead of n", "using the unbiased variance in the reference",
                         partial(run_layer, site, LayerOptions(unbiased=flags)), "norm",
                         changes=(site.module(where),))
