"""Pooler bugs: no tanh, mean pooling instead of the first token."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from introspect.diff.hypotheses.hypothesis import Hypothesis, run_pooler
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "pooler":
        return
    yield Hypothesis("the candidate's pooler leaves out the tanh",
                     "dropping the tanh from the reference's pooler",
                     lambda: run_pooler(site, tanh=False), "pooler")
    yield Hypothesis("the candidate's pooler takes the mean over real tokens instead of the "
                     "first token ([CLS])", "mean-pooling the real tokens in the reference",
                     lambda: run_pooler(site, mode="masked-mean"), "pooler")
    yield Hypothesis("the candidate's pooler takes the mean over all positions, padding "
                     "included, instead of the first token ([CLS])",
                     "mean-pooling every position in the reference",
                     lambda: run_pooler(site, mode="mean"), "pooler")
    for mode, words in (("masked-mean", "real tokens"), ("mean", "all positions")):
        yield Hypothesis(f"the candidate's pooler takes the mean over {words} instead of the "
                         "first token ([CLS]) and leaves out the tanh",
                         "mean-pooling without tanh in the reference",
                         partial(run_pooler, site, mode=mode, tanh=False), "pooler")
