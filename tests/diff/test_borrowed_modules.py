"""A port that runs the reference's own modules agrees with itself: the run says so
(issue 34, "a port returning the reference passes with no note").

The note never changes a verdict: a port that keeps HF's embeddings and writes the rest is
legal, and the rest is still compared.
"""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.diff.modules.cancelled import CANCELLED
from introspect.scratch import BertModel as ScratchBert
from tests.conftest import make_batch


class Returns(torch.nn.Module):
    """``build`` returns a wrapper whose forward calls the model it was handed."""

    def __init__(self, reference: torch.nn.Module, as_submodule: bool):
        super().__init__()
        if as_submodule:
            self.inner = reference
        else:  # held outside the module tree, as a closure would hold it
            object.__setattr__(self, "inner", reference)
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.inner(input_ids=input_ids, token_type_ids=token_type_ids,
                         attention_mask=attention_mask)
        return {"last_hidden_state": out.last_hidden_state * self.scale,
                "pooler_output": out.pooler_output}


def _notes(result) -> list[str]:
    return [n for n in result.notes if "reference's own modules" in n or
            "runs the reference itself" in n]


@pytest.mark.parametrize("as_submodule", [True, False])
def test_a_port_that_returns_the_reference_passes_with_a_note(tiny_models, as_submodule):
    hf = tiny_models("base").model
    result = introspect.diff(hf, Returns(hf, as_submodule), make_batch(2, 8, padded=True))
    assert result.passed
    assert len(_notes(result)) == 1
    assert "compared with itself, and parity proves nothing" in _notes(result)[0]


def test_a_port_that_keeps_the_references_embeddings_is_named_and_still_compared(tiny_models):
    hf = tiny_models("base").model
    port = ScratchBert.from_hf(hf)
    port.embeddings = hf.embeddings  # the rest is the port's own
    result = introspect.diff(hf, port, make_batch(2, 8, padded=True))
    assert result.passed
    assert _notes(result) == ["the candidate runs 1 of the reference's own modules "
                              "(embeddings): those parts are compared with themselves"]
    with torch.no_grad():  # the port's own part, broken (one feature's bias: the same
        port.encoder.layer[1].output.dense.bias[:1].add_(0.5)  # shift of every feature
    try:  # is one the LayerNorm after it takes away: ``test_a_shift_its_norm_takes_away``)
        assert not introspect.diff(hf, port, make_batch(2, 8, padded=True)).passed
    finally:
        with torch.no_grad():
            port.encoder.layer[1].output.dense.bias[:1].sub_(0.5)


def test_a_shift_its_norm_takes_away_passes_as_cancelled(tiny_models):
    """Every feature of a Linear's bias shifted alike before the LayerNorm that centres
    its rows: the same function (LN(x + c) = LN(x)). The Linear, paired by its weight
    alone (``pairing.IN_PART``), is over its budget, and cancelled in the module that
    holds it; the port passes."""
    hf = tiny_models("base").model
    port = ScratchBert.from_hf(hf)
    with torch.no_grad():
        port.encoder.layer[1].output.dense.bias.add_(0.5)
    result = introspect.diff(hf, port, make_batch(2, 8, padded=True), nodes=False)
    assert result.passed, result.summary()
    rows = result.modules[result.modules.status == "unconfirmed"]
    assert list(rows.reference_module) == ["encoder.layer.1.output.dense"], rows
    assert rows.note.str.startswith(CANCELLED).all()


def test_a_port_of_its_own_gets_no_such_note(tiny_models):
    hf = tiny_models("base").model
    result = introspect.diff(hf, ScratchBert.from_hf(hf), make_batch(2, 8, padded=True))
    assert result.passed and _notes(result) == []
