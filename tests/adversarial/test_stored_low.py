"""Weights stored in a 16-bit dtype and upcast to compute are named (probe round u, port
13: a port keeping its parameters in bfloat16 failed at the embeddings' first add with no
cause said; every node computes in float32, so no dtype differs there).
``hypotheses.stored_dtype`` runs the block again on its weights rounded to the dtype the
candidate stores parameters in.

Judged here at the hypotheses, on a hand-built divergence at the embeddings' output: whether a
port storing its weights rounded passes or fails depends on the inputs under the 16-bit
budget its parameters earn (docs/verdict.md); where it fails, this is the cause to say.
The same code with float32 parameters passes, and a fault of another kind in a float32
port is not blamed on a dtype it does not store."""

from __future__ import annotations

import pytest
import torch

from introspect.diff.hypotheses import DivergenceContext, explain_divergence
from tests.adversarial.corpus import diff_port, port

ATOL, RTOL = 1e-5, 1.3e-6


def _output(model, inputs, module_of):
    seen = []
    handle = module_of(model).register_forward_hook(lambda m, a, out: seen.append(
        (out[0] if isinstance(out, tuple) else out).detach()))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        handle.remove()
    return seen[0]


def _context(reference, candidate, inputs):
    inputs = dict(inputs.tensors)
    return DivergenceContext(
        reference_model=reference.model, candidate_model=candidate, inputs=inputs,
        reference_node="embeddings output", candidate_node="", module="embeddings",
        layer="embeddings",
        reference_value=_output(reference.model, inputs, lambda m: m.embeddings),
        candidate_value=_output(candidate, inputs, lambda m: m.embedded),
        atol=ATOL, rtol=RTOL)


def test_parameters_kept_in_float32_pass(mini):
    result = diff_port(mini, "stored_low.py", "fp32")
    assert result.passed, result.summary()


@pytest.mark.parametrize("build, dtype", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_weights_stored_rounded_are_named(mini, build, dtype):
    reference, inputs = mini
    candidate = getattr(port("stored_low.py"), build)(reference)
    hints = explain_divergence(_context(reference, candidate, inputs))
    named = [h for h in hints if "stores its weights in" in h]
    assert len(named) == 1, hints
    assert named[0].startswith(f"the candidate stores its weights in {dtype} ")


def test_a_float32_port_is_not_blamed_on_a_dtype(mini):
    reference, inputs = mini
    candidate = port("stored_low.py").fp32(reference)
    context = _context(reference, candidate, inputs)
    moved = DivergenceContext(**{**context.__dict__,
                                 "candidate_value": context.candidate_value * 1.01})
    assert not any("stores its weights" in h for h in explain_divergence(moved))
