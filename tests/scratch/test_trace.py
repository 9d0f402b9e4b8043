"""Every scratch head traces with introspect's fx tracer, with no value-dependent branch."""

from __future__ import annotations

import pytest
import torch

import introspect.scratch as scratch
from introspect.tracing.tracer import trace_module
from tests.scratch.conftest import HEADS, make_inputs

CONFIG = scratch.BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=40,
)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("head", HEADS)
def test_traced_graph_gives_the_eager_outputs(head: str, attn: str) -> None:
    model = getattr(scratch, head)(CONFIG.replace(attn_implementation=attn)).eval()
    inputs = make_inputs(head, vocab_size=100)
    result = trace_module(model, inputs)
    assert result.decisions == []  # nothing was specialised on the example's values
    with torch.no_grad():
        expected = model(**inputs)
        assert set(result.output_names) == set(expected)
        # The graph is symbolic in batch size and sequence length, and holds the mask for
        # any mask values (all ones included).
        for other in (inputs, make_inputs(head, vocab_size=100, padded=False, batch=3, seq=17)):
            expected = model(**other)
            traced = result.gm(**other)
            for name in expected:
                assert torch.equal(traced[name], expected[name]), name


def test_the_position_branch_is_in_the_graph() -> None:
    result = trace_module(scratch.BertModel(CONFIG).eval(), make_inputs(vocab_size=100))
    nodes = {
        node.target for node in result.gm.graph.nodes if node.op in ("get_attr", "call_module")
    }
    assert "embeddings.position_ids" in nodes
    assert "embeddings.position_embeddings" in nodes
    assert "encoder.layer.1.intermediate.intermediate_act_fn" in nodes  # a leaf, swappable
