"""A port that is ``torch.export``'s module (``ExportedProgram.module()``): a program captured
in one mode, whose ``train()`` and ``eval()`` raise ``NotImplementedError``. The diff put
every candidate in eval mode with ``.eval()`` and ended in an internal error (exit 2, "a
bug: please report it"); the correct export now passes and a faulty one fails in its
layer (probe round g)."""

from __future__ import annotations

import copy

import pytest
import torch

import introspect
from tests.conftest import make_batch


def _exported(model: torch.nn.Module, tensors) -> torch.nn.Module:
    class Plain(torch.nn.Module):  # the outputs as a tuple: what export keeps
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, token_type_ids, attention_mask):
            out = self.inner(input_ids=input_ids, token_type_ids=token_type_ids,
                             attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    return torch.export.export(Plain(model).eval(), (), kwargs=dict(tensors)).module()


@pytest.fixture(scope="module")
def batch():
    return make_batch(2, 8, padded=True)


def test_an_exported_port_refuses_eval_and_still_gets_a_verdict(tiny_models, batch):
    hf = tiny_models("base").model
    port = _exported(copy.deepcopy(hf), batch)
    with pytest.raises(NotImplementedError):
        port.eval()  # (what the diff called)
    result = introspect.diff(hf, port, batch, nodes=False)
    assert result.passed, result


def test_a_faulty_exported_port_fails_in_its_layer(tiny_models, batch):
    hf = tiny_models("base").model
    faulty = copy.deepcopy(hf)
    faulty.encoder.layer[1].intermediate.intermediate_act_fn = \
        torch.nn.GELU(approximate="tanh")
    result = introspect.diff(hf, _exported(faulty, batch), batch, nodes=False)
    assert not result.passed
    assert result.first_divergence is not None
    assert result.first_divergence.layer == "encoder.layer.1"
