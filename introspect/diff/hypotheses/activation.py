"""Activation bugs: GELU's tanh approximation against the exact erf form, and another
activation where GELU belongs (ReLU, SiLU, QuickGELU's x * sigmoid(1.702 x))."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

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
    for option, name in (("relu", "ReLU"), ("silu", "SiLU (x * sigmoid(x))"),
                         ("quick", "QuickGELU (x * sigmoid(1.702 x))")):
        yield Hypothesis(f"the candidate's FFN activation is {name}, not the reference's "
                         "own activation", f"using {name.split(' ')[0]} in the reference",
                         partial(run_layer, site, LayerOptions(activation=option)),
                         "activation", changes=(activation,))
