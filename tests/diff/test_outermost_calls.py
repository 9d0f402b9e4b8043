"""The outermost of a plain call's module calls, found in one pass by their start
(``accounted._outermost``), are those a pair of loops over every two calls finds
(``accounted._inside``): on random nestings, calls not seen starting among them."""

from __future__ import annotations

import random

import pytest
import torch

from introspect.diff.modules.accounted import _inside, _outermost
from introspect.run.capture import ModuleCall
from introspect.run.truth import AUTOGRAD


def _nested_calls(seed: int) -> list[ModuleCall]:
    """Calls as one thread makes them: each starts, may call others, and finishes; some
    were not seen starting (``started`` -1), as a call under vmap or a late hook's."""
    rng = random.Random(seed)
    module = torch.nn.Identity()
    calls: list[ModuleCall] = []
    begun = finished = 0

    def call(depth: int) -> None:
        nonlocal begun, finished
        begun += 1
        started = begun if rng.random() > 0.1 else -1
        for _ in range(rng.randrange(4) if depth < 4 else 0):
            call(depth + 1)
        finished += 1
        calls.append(ModuleCall(f"m{len(calls)}", module, AUTOGRAD, True, (), {}, [], [],
                                finished, False, started=started))

    for _ in range(rng.randrange(1, 4)):
        call(0)
    rng.shuffle(calls)
    return calls


@pytest.mark.parametrize("seed", range(40))
def test_the_outermost_calls_are_those_inside_no_other(seed):
    calls = _nested_calls(seed)
    slow = {id(c) for c in calls if not any(_inside(c, other) for other in calls)}
    assert _outermost(calls) == slow
    assert slow  # (every nesting has an outermost call)
