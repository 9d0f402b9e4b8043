"""Pooler bugs: no tanh, mean pooling instead of the first token, also seen under a head.

A pooler bug often shows first in the head that reads the pooled output (a sequence
classifier's Linear), where the two models' pooled outputs were never paired: the
divergence is then the head's output. ``head_hints`` re-runs the reference's pooler with
each bug and feeds the result to the reference's own head; a hint is given when that
reproduces the candidate's head output, as for every hypothesis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import partial

import torch

from introspect.diff.hypotheses.context import DivergenceContext
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_pooler
from introspect.diff.hypotheses.matching import same
from introspect.diff.hypotheses.site import Site, _capture_input, bert_prefix, locate
from introspect.diff.hypotheses.tokens import budget, reproduces, sentence


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "pooler":
        return
    yield Hypothesis("the candidate's pooler leaves out the tanh (pooler activation missing)",
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


UNDER_THE_HEAD = ", under the head "  # (in a pooler bug's hint seen at the head)


def head_hints(context: DivergenceContext) -> list[str]:
    """Pooler bugs seen at a head that reads the pooled output (e.g. ``classifier``)."""
    model = context.reference_model
    prefix = bert_prefix(model)
    if not prefix or not context.module or context.module.startswith(prefix):
        return []  # no head around a BERT body, or the divergence is inside the body
    try:
        head = model.get_submodule(context.module)
        site = locate(dataclasses.replace(context, layer="pooler"))
    except (AttributeError, IndexError, TypeError):
        return []
    if site is None or site.kind != "pooler" or site.block_input is None:
        return []
    pooled = run_pooler(site)["pooled"]
    read = _capture_input(model, head, context.inputs)  # through a Dropout, the identity
    if read is None or not same(read, pooled):
        return []  # this head does not read the pooled output
    base = head(pooled)
    candidate = context.candidate_value.detach()
    if not isinstance(base, torch.Tensor) or not same(base, context.reference_value.detach()) \
            or candidate.shape != base.shape:
        return []  # the divergent node is not this head's output
    everywhere = torch.ones(candidate.shape, dtype=torch.bool)
    allowed = budget(candidate, everywhere, context.atol, context.rtol)
    found = []
    skipped = Hypothesis("the candidate's head reads the first token's ([CLS]) hidden state "
                         "itself: the reference's pooler (its dense and tanh) is skipped",
                         "feeding the first token's hidden state to the reference's head",
                         lambda: run_pooler(site, dense=False), "pooler")
    for hypothesis in (*hypotheses(site), skipped):
        value = head(hypothesis.run()["pooled"])
        result = reproduces(value, base, candidate, everywhere, allowed)
        if result is not None:
            found.append(sentence(f"{hypothesis.what}{UNDER_THE_HEAD}{context.module}",
                                  f"{hypothesis.how} and applying its {context.module}",
                                  result))
    return found
