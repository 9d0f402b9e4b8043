"""Activation bugs: GELU's tanh approximation against the exact erf form."""

from __future__ import annotations

from collections.abc import Iterator

from introspect.diff.hypotheses.blocks import LayerOptions
from introspect.diff.hypotheses.hypothesis import Hypothesis, run_layer
from introspect.diff.hypotheses.site import Site


def hypotheses(site: Site) -> Iterator[Hypothesis]:
    if site.kind != "layer":
        return
    activation = site.module("intermediate.intermediate_act_fn")
    yield Hypothesis("the candidate uses the tanh approximation of GELU where the reference "
                     "uses the exact (erf) GELU", "using the tanh GELU in the reference",
                     lambda: run_layer(site, LayerOptions(activation="tanh")), "activation",
                     changes=(activation,))
    yield Hypothesis("the candidate uses the exact (erf) GELU where the reference uses "
                     "another activation", "using the erf GELU in the reference",
                     lambda: run_layer(site, LayerOptions(activation="erf")), "activation",
                     changes=(activation,))
