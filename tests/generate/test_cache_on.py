"""Decoders built with their default config (KV cache on) trace, draw and diff."""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.tracing.tracer import CACHE_OFF_NOTE

from .conftest import PROMPT


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_trace_and_draw_with_the_cache_on(name, request):
    model = request.getfixturevalue(name)
    graph = introspect.trace(model, {"input_ids": PROMPT}, cache=False)
    assert CACHE_OFF_NOTE in graph.notes
    assert model.config.use_cache  # the user's model is left as it was
    assert "cache" not in " ".join(graph.output_names)
    logits = graph.gm(input_ids=PROMPT)["logits"]
    with torch.no_grad():
        expected = model(input_ids=PROMPT, use_cache=False).logits
    assert torch.equal(logits, expected)
    dot = graph.draw().source
    assert "lm_head" in dot


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_diff_against_itself_with_the_cache_on(name, request):
    model = request.getfixturevalue(name)
    result = introspect.diff(model, model, {"input_ids": PROMPT})
    assert result.passed and result.max_abs_err == 0.0
    assert sum(CACHE_OFF_NOTE in n for n in result.notes) == 2  # each side's
    assert not result.step_rows  # one forward: no steps


def test_a_model_without_use_cache_gets_no_note(gpt2):
    class Plain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = gpt2

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, use_cache=False).logits

    graph = introspect.trace(Plain().eval(), {"input_ids": PROMPT}, cache=False)
    assert CACHE_OFF_NOTE not in graph.notes
