"""Where the handed gradients part: the module a weight's gradient FAIL from each side's
own backward names.

A weight whose gradient is over budget names where the error arrived, not where it was
made: a norm whose backward drops a term (its forward exact) moves the gradients of every
weight before it, and the nearest the loss of those is the previous layer's. What each
module's output was handed in the user's own backward (``Leaf.grad``, module evidence's
pairs) says more: going from the loss, the handed gradients agree until the value whose
gradient is first over budget. That value was handed its gradient by the modules that
took it, whose own outputs were handed gradients within budget: one of them gave back a
wrong one. The outermost of them (a layer, where its attention and its norm took the
value too) holds every path back, and is named (the reference's module its call is
paired with).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from introspect.diff.backward.results import BackwardDivergence
from introspect.diff.modules.evidence import ModuleEvidence
from introspect.diff.modules.pairing import ModulePair
from introspect.diff.modules.paths import depth
from introspect.run.capture import Leaf
from introspect.run.truth import AUTOGRAD, same_view


@dataclasses.dataclass(frozen=True)
class Parting:
    """The module whose backward hands its input a gradient over budget, the one it was
    handed within budget: ``pair`` (its call and the reference's module), the input's
    producer (the candidate's module that returned it; "" for the value ``returned``) and
    that gradient's error (NaN for that value: no pair measured it)."""

    pair: ModulePair
    producer: str
    error: float


HANDS_BACK = "hands back to"  # (in the hint of a divergence named at a failing output only)


def handed_hint(taker: str, producer: str) -> str:
    """The hint of a divergence named at ``taker``, which took ``producer``'s output."""
    return (f"the gradient {taker} {HANDS_BACK} {producer}'s output is over budget, where "
            "the gradient its own output was handed is within: its backward parts from the "
            "reference's (the weights before it are all it moves)")


def weight_hint(weight: str, taker: str, owner: str) -> str:
    """The hint where no module output's gradient is over budget: ``taker`` took the
    output of ``owner``, the module of ``weight``, whose gradient is."""
    return (f"{weight}'s gradient is over budget, where every module output was handed a "
            f"gradient within: what {taker} passes back to {owner}'s output moves it (its "
            "backward parts from the reference's)")


def parted_at_an_output(divergence: BackwardDivergence) -> bool:
    """``divergence`` names the module that took a module output whose handed gradient is
    over budget (not the weaker naming where none is: what took an embedding's output)."""
    return not divergence.parameter and any(HANDS_BACK in h for h in divergence.hints[:1])


# (mine, theirs) -> (max abs error, over budget): the measure the PASS holds them to
Measure = Callable[[Leaf, Leaf], tuple[float, bool]]


def where_gradients_part(evidence: ModuleEvidence, measure: Measure,
                         returned: Leaf | None = None) -> Parting | None:
    """The module whose backward first parts (see the module's docstring); None where no
    handed gradient is over budget, or no module that took that value is paired.
    ``returned``: where no handed gradient is over budget, the value whose takers are
    looked at (what a failing weight's module returned: an embedding, judged by no
    pair)."""
    compared: list[tuple[ModulePair, Leaf, Leaf]] = []
    for pair in evidence.pairs:
        call = pair.call
        theirs = pair.output.boundary.returned_leaf
        if call.mode != AUTOGRAD or not call.outputs or theirs is None:
            continue
        mine = call.outputs[0]
        if mine.grad is None or theirs.grad is None or mine.grad_edited() \
                or theirs.grad_edited():
            continue
        compared.append((pair, mine, theirs))
    compared.sort(key=lambda item: item[0].call.order)
    judged = [(pair, mine, *measure(mine, theirs)) for pair, mine, theirs in compared]
    failing = [item for item in judged if item[3]]
    if failing:
        producer, value, error, _ = failing[-1]  # the nearest the loss
        name, after = producer.call.name, producer.call.order
    elif returned is not None:
        value, error, name, after = returned, math.nan, "", -1
    else:
        return None
    within = [pair for pair, mine, _, over in judged
              if not over and pair.call.order > after and mine is not value
              and any(same_view(leaf.value, value.value) for leaf in pair.call.inputs)]
    if not within:
        return None
    taker = min(within, key=lambda pair: (depth(pair.call.name), pair.call.order))
    return Parting(taker, name, error)


__all__ = ["HANDS_BACK", "Measure", "Parting", "handed_hint", "parted_at_an_output",
           "weight_hint", "where_gradients_part"]
