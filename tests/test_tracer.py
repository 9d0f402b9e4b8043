"""The fx tracer reproduces HF BERT exactly, for every head and both attention paths."""

from __future__ import annotations

import pickle

import pytest
import torch

from introspect.errors import TraceError
from introspect.models.load import HEADS
from introspect.tracing.tracer import trace_module
from tests.conftest import make_batch

# (batch, seq, padded): the traced shape, an unpadded batch, and a second shape.
SHAPES = [(2, 9, True), (2, 9, False), (3, 17, True), (1, 5, False)]


def _batch(head: str, batch: int, seq: int, padded: bool) -> dict[str, torch.Tensor]:
    return make_batch(batch, seq, padded=padded, choices=3 if head == "multiple-choice" else 0,
                      seed=batch * 100 + seq)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("head", list(HEADS))
def test_graph_module_outputs_equal_hf_exactly(tiny_models, head, attn):
    model = tiny_models(head, attn).model
    result = trace_module(model, _batch(head, 2, 9, True))
    for batch, seq, padded in SHAPES:
        inputs = _batch(head, batch, seq, padded)
        with torch.no_grad():
            expected = {k: v for k, v in model(**inputs).items() if v is not None}
            got = result.gm(**inputs)
        assert set(got) == set(expected), (batch, seq, padded)
        for key in expected:
            assert torch.equal(got[key], expected[key]), (key, batch, seq, padded)


def test_real_minilm_weights_trace_exactly(minilm):
    inputs = make_batch(2, 11, padded=True)
    result = trace_module(minilm.model, inputs)
    with torch.no_grad():
        expected = minilm.model(**inputs)
        for shape in [(2, 11, True), (4, 7, False)]:
            other = make_batch(*shape[:2], padded=shape[2], seed=3)
            assert torch.equal(result.gm(**other)["last_hidden_state"],
                               minilm.model(**other).last_hidden_state)
    assert torch.equal(result.gm(**inputs)["pooler_output"], expected.pooler_output)


def test_module_level_graph_keeps_leaves_and_position_branch(tiny_models):
    result = trace_module(tiny_models("base").model, make_batch(2, 9, padded=True))
    graph = result.gm.graph
    called = {str(n.target) for n in graph.nodes if n.op == "call_module"}
    assert "encoder.layer.0.attention.self.query" in called
    assert "embeddings.LayerNorm" in called
    assert "embeddings.position_embeddings" in called
    assert "pooler.activation" in called  # nn.Tanh
    assert "encoder.layer.1.intermediate.intermediate_act_fn" in called  # HF's GELU module
    buffers = [n for n in graph.nodes
               if n.op == "get_attr" and str(n.target).endswith("position_ids")]
    assert len(buffers) == 1  # the position branch is fed by the buffer, not a constant
    position = next(n for n in graph.nodes if n.target == "embeddings.position_embeddings")
    assert buffers[0] in _ancestors(position)
    functions = {getattr(n.target, "__name__", "") for n in graph.nodes if n.op == "call_function"}
    assert "scaled_dot_product_attention" in functions


def test_eager_attention_is_drawn_as_functions(tiny_models):
    result = trace_module(tiny_models("base", "eager").model, make_batch(2, 9, padded=True))
    functions = [getattr(n.target, "__name__", "") for n in result.gm.graph.nodes
                 if n.op == "call_function"]
    assert functions.count("matmul") == 2 * 2  # QK^T and PV in each of 2 layers
    assert functions.count("softmax") == 2


def test_same_graph_for_padded_and_unpadded_masks(tiny_models):
    model = tiny_models("base").model
    padded = trace_module(model, make_batch(2, 9, padded=True)).gm.code
    unpadded = trace_module(model, make_batch(2, 9, padded=False)).gm.code
    assert padded == unpadded


def test_graph_module_pickles_and_loads_again(tiny_models):
    model = tiny_models("base").model
    inputs = make_batch(2, 9, padded=True)
    gm = trace_module(model, inputs).gm
    again = pickle.loads(pickle.dumps(gm))
    assert torch.equal(again(**inputs)["last_hidden_state"], gm(**inputs)["last_hidden_state"])


def test_untraceable_value_branch_names_the_node():
    class BranchesOnValues(torch.nn.Module):
        def forward(self, input_ids):
            if input_ids.sum() > 0:
                return input_ids * 2
            return input_ids

    with pytest.raises(TraceError, match="branches on the values of node gt"):
        trace_module(BranchesOnValues(), {"input_ids": torch.ones(2, 3)})


def test_unknown_input_name_is_refused(tiny_models):
    with pytest.raises(TraceError, match="takes no argument named pixels"):
        trace_module(torch.nn.Linear(2, 2), {"pixels": torch.ones(2)})


def _ancestors(node):
    seen, stack = set(), [node]
    while stack:
        for parent in stack.pop().all_input_nodes:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def test_torchs_fake_tensor_log_is_quiet_while_we_trace(capsys):
    """A forward running work in worker threads shares the trace's fake mode with them;
    torch logs the failure it meets there with a whole traceback before raising it, and
    the trace falls back as for any other failure. The log is quiet while we trace (here
    the forward logs as torch would), and as it was afterwards."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    seen = []

    class LogsAsTorchDoes(torch.nn.Module):
        def forward(self, input_ids):
            seen.append(logger.getEffectiveLevel())
            logger.error("Traceback (most recent call last): AssertionError: False, True")
            return input_ids.float() * 2

    before = logger.level
    trace_module(LogsAsTorchDoes(), {"input_ids": torch.ones(2, 3, dtype=torch.long)})
    assert seen and all(level > logging.ERROR for level in seen)
    assert logger.level == before
    assert "Traceback" not in capsys.readouterr().err
