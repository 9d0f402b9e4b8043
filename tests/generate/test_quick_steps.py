"""One-token steps measured on the models' own values (``generation.quick``): a weight
edited between steps fails at that step, whichever way it is edited, and the proof that
lets an alignment serve again sees every edit that changes a storage or a version
counter."""

from __future__ import annotations

import pytest

import introspect
from introspect.diff.generation import quick
from tests.generate import gpt2_concat
from tests.generate.gpt2_restructured import RestructuredGPT2
from tests.generate.gpt2_weight_edits import EditingGPT2

from .conftest import PROMPT

EDITS = ("in-place", "data", "parameter")


# ``data-in-place`` keeps the weight's storage and version counter: the proof does not see
# it (the alignment and the weight relations serve again), the step's values do.
@pytest.mark.parametrize("edit", [*EDITS, "data-in-place"])
def test_a_weight_edited_between_steps_fails_at_that_step(gpt2, edit):
    result = introspect.diff(gpt2, EditingGPT2(gpt2, edit), {"input_ids": PROMPT}, generate=4)
    assert not result.passed
    d = result.first_divergence
    assert d is not None and d.step == 2, result.summary()
    assert d.module.startswith("transformer.h.0.mlp"), result.summary()
    assert list(result.steps["passed"])[:2] == [True, True]


@pytest.mark.parametrize("edit", EDITS)
def test_the_proof_sees_every_edit(gpt2, edit):
    port = EditingGPT2(gpt2, edit)
    before = quick.model_state(port)
    assert quick.model_state(port) == before  # nothing changed: the same state
    port._edit_weight()
    assert quick.model_state(port) != before


def test_a_module_attribute_change_is_seen(gpt2):
    port = gpt2_concat.GPT2(gpt2)
    before = quick.model_state(port)
    port.eps = 1e-3
    assert quick.model_state(port) != before


def test_steps_after_the_first_reuse_its_alignment(gpt2, monkeypatch):
    made = []
    align = quick.QuickSteps._align
    monkeypatch.setattr(quick.QuickSteps, "_align",
                        lambda self, *a: made.append(1) or align(self, *a))
    result = introspect.diff(gpt2, gpt2_concat.GPT2(gpt2), {"input_ids": PROMPT}, generate=5)
    assert result.passed, result.summary()
    assert len(made) == 1  # step 1 aligned; steps 2 to 4 proven unchanged and reused it
    edited = EditingGPT2(gpt2, "in-place")
    made.clear()
    introspect.diff(gpt2, edited, {"input_ids": PROMPT}, generate=5)
    # step 1; step 2, whose graph holds the edit (made inside its forward); step 3, which
    # finds the weight's version counter and the port's own flag changed
    assert len(made) == 3


# The structure proof is read from the step's log of calls (``call_log``): a step whose
# calls differ by one op, one target or one input is aligned anew, never measured by the
# pairs of the structure before it.
@pytest.mark.parametrize("variant", ["extra-op", "other-target", "other-wiring"])
def test_a_structure_changed_at_a_step_is_aligned_anew(gpt2, variant, monkeypatch):
    made = []
    align = quick.QuickSteps._align
    monkeypatch.setattr(quick.QuickSteps, "_align",
                        lambda self, *a: made.append(1) or align(self, *a))
    result = introspect.diff(gpt2, RestructuredGPT2(gpt2, variant), {"input_ids": PROMPT},
                             generate=5)
    assert result.passed, result.summary()
    assert len(made) == 2  # step 1; step 2, the new structure (steps 3 and 4 reuse it)


def test_an_input_rewired_at_a_step_fails_at_that_step(gpt2):
    result = introspect.diff(gpt2, RestructuredGPT2(gpt2, "wrong-wiring"),
                             {"input_ids": PROMPT}, generate=4)
    assert not result.passed
    d = result.first_divergence
    assert d is not None and d.step == 2, result.summary()
    assert d.module.startswith("transformer.h.1"), result.summary()
    assert list(result.steps["passed"])[:2] == [True, True]
