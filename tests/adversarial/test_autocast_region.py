"""A layer its caller runs inside ``torch.autocast`` (``ports/autocast_region.py``).

Module evidence runs each of the candidate's modules again, alone, on the reference's
inputs to it. It ran them outside the autocast region their caller had set, so the
faulty layer (bf16 inside it) computed in float32 there and passed: the FAIL named only
``last_hidden_state``. Each module call now keeps the context its caller set (autocast on
each device, the default dtype: ``capture.ModuleCall.context``) and is run again in it.
"""

from __future__ import annotations

import pytest
import torch

from tests.adversarial.corpus import port


@pytest.mark.parametrize("nodes", [False, True])
def test_the_correct_region_passes_and_the_bf16_one_fails_in_its_layer(tiny, nodes):
    import introspect

    reference, inputs = tiny
    ports = port("autocast_region.py")
    passed = introspect.diff(reference.model, ports.correct(reference), inputs, nodes=nodes)
    assert passed.passed, passed.summary()
    failed = introspect.diff(reference.model, ports.faulty(reference), inputs, nodes=nodes)
    assert not failed.passed
    divergence = failed.first_divergence
    assert divergence.layer == "encoder.layer.1", divergence
    assert divergence.candidate_module.startswith("blocks.1"), divergence


def test_a_module_is_run_again_in_the_context_its_caller_set():
    from introspect.run.capture import call_context, capture_calls

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with capture_calls(model) as calls:
        from introspect.run.truth import run_truth

        def region(x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(x)
        wrapper = torch.nn.Module()
        wrapper.forward = region  # type: ignore[method-assign]
        run_truth(model, {"input": torch.ones(2, 4)})
    (call,) = [c for c in calls.calls if c.name == "0"][:1]
    assert call.context[0] == ()  # called plainly: no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        from introspect.run import capture

        seen = capture._context()
    assert seen[0] == (("cpu", torch.bfloat16),)
    inside = dataclasses_replace(call, context=seen)
    with call_context(inside):
        assert torch.is_autocast_enabled("cpu")
        assert call.module(torch.ones(1, 4)).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


def dataclasses_replace(call, **changes):
    import dataclasses

    return dataclasses.replace(call, **changes)
