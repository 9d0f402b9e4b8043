"""A hint must never be wrong: the hints added for issue 20 fire only on their own fault.

Every fault of the independent ports (tests/ports) goes through ``introspect.diff`` on
bert-tiny; a dropout-in-the-values, reshaped-weight, pooler-under-a-head or
position-consumer hint must not appear where the fault is another one, and a correct port
gets no hint at all.
"""

from __future__ import annotations

import importlib

import pytest

import introspect
from tests.ports.batch import port_batch

STYLES = ("hf_like", "nanogpt_style", "functional")
# hint prefix -> the faults it may name
NEW_HINTS = {
    "dropout is active in the candidate at ": ("dropout_active",),
    "is reshaped, not transposed": (),
    "is rearranged by a reshape": (),
    ", under the head ": (),  # every port here is a base model: no head
    "the reference's position ids (taken by ": ("position_offset",),
    "nor a padding mask": (),  # a decoder's
}


@pytest.fixture(scope="module")
def tiny(tiny_models):
    loaded = tiny_models("base", "sdpa")
    return loaded.model, port_batch(loaded.tokenizer)


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_the_new_hints_fire_only_on_their_fault(tiny, style):
    reference, batch = tiny
    module = importlib.import_module(f"tests.ports.{style}")
    wrong = []
    for fault in (None, *module.FAULTS):
        result = introspect.diff(reference, module.build(reference, fault, layer=0), batch)
        hints = result.first_divergence.hints if result.first_divergence else ()
        if fault is None:
            assert result.passed and not hints, hints
        wrong += [(fault, h) for h in hints for words, faults in NEW_HINTS.items()
                  if words in h and fault not in faults]
    assert not wrong, wrong
