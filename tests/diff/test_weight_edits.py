"""A forward that edits its own weights (``weight.data *= 1.001`` per call) fails, and is
named as such: not as dropout, not as a weight left unloaded (issue 30)."""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.run.truth import edited_weights, weight_sums
from tests.conftest import make_batch
from tests.diff.weight_edit_port import Drifting


def test_a_forward_that_edits_its_weights_fails_and_is_named(tiny_models):
    hf = tiny_models("base").model
    result = introspect.diff(hf, Drifting(hf), make_batch(2, 8, padded=True))
    assert not result.passed
    said = " ".join(result.notes) + " ".join(result.first_divergence.hints
                                             if result.first_divergence else ())
    assert "forward edits its own weights (inner.encoder.layer.1.intermediate.dense.weight)" \
        in said
    assert "dropout is active" not in said and "left unloaded" not in said


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_checksum_sees_one_value_one_step_off_in_any_dtype(dtype):
    model = torch.nn.Linear(300, 5000).to(dtype)  # 1.5M values: more than one chunk
    before = weight_sums(model)
    assert weight_sums(model) == before  # reading changes nothing
    with torch.no_grad():
        flat = model.weight.data.view(-1)  # through .data: no version counter moves
        flat[1_234_567] = torch.nextafter(flat[1_234_567], torch.tensor(9.0, dtype=dtype))
    assert edited_weights(before, weight_sums(model)) == ["weight"]


def test_a_nan_weight_is_a_value_like_any_other():
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert edited_weights(weight_sums(model), weight_sums(model)) == []


def _perturbed(model):
    """bert-tiny with every norm and bias moved off its init (a weight shared by value
    with many others relates to all of them)."""
    import copy

    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def test_a_weight_edited_after_the_last_call_is_named_on_a_pass_without_recording(tiny_models):
    from tests.diff.weight_edit_port import EditsAfterItsLastCall

    hf = _perturbed(tiny_models("base").model)
    with torch.no_grad():
        hf.encoder.layer[0].output.dense.weight[0, 0] = 0.0  # the port writes -0.0 there
    result = introspect.diff(hf, EditsAfterItsLastCall(hf), make_batch(2, 8, padded=True),
                             nodes=False)
    assert result.passed and len(result.nodes) == 0  # every value as the reference's
    assert "forward edits its own weights (inner.encoder.layer.0.output.dense.weight)" \
        in " ".join(result.notes)


def test_weights_proven_the_references_bytes_are_not_read_again(tiny_models, monkeypatch):
    """A close port's PASS reads its weights once for their checksums (before its calls):
    after them, each weight the pairing found holding a reference weight's bytes has that
    weight's checksum, which the reference's footprint read at the end. Only the others
    (here: none of bert-tiny's are laid out otherwise) are read again."""
    import copy
    import importlib

    candidate_flow = importlib.import_module("introspect.diff.flow.candidate")
    pairing = importlib.import_module("introspect.diff.modules.pairing")
    hf = _perturbed(tiny_models("base").model)
    port = copy.deepcopy(hf)
    read: list[set[str] | None] = []
    real = candidate_flow.weight_sums

    def counted(model, only=None):
        read.append(only)
        return real(model, only=only)

    monkeypatch.setattr(candidate_flow, "weight_sums", counted)
    result = introspect.diff(hf, port, make_batch(2, 8, padded=True), nodes=False)
    assert result.passed and len(result.nodes) == 0
    assert read[0] is None and len(read) == 2  # all before the calls, some after them:
    small = pairing._EXACT_KEY  # the vectors, related by their values as a key, no memcmp
    weights = dict(port.named_parameters())
    assert read[1] and all(weights[name].numel() <= small for name in read[1])
    assert all(name in read[1] for name, w in weights.items() if w.numel() <= small)
    assert not any("edits its own weights" in n for n in result.notes)


def test_a_weight_whose_reference_moved_is_read_again(tiny_models):
    """The shortcut needs the reference's weight unchanged since before the candidate was
    built: where its footprint moved, the candidate's weight is read."""
    import copy
    import importlib

    candidate_flow = importlib.import_module("introspect.diff.flow.candidate")
    state_module = importlib.import_module("introspect.diff.flow.state")
    footprint = importlib.import_module("introspect.run.footprint")
    pairing = importlib.import_module("introspect.diff.modules.pairing")
    hf = _perturbed(tiny_models("base").model)
    port = copy.deepcopy(hf)
    name = "encoder.layer.0.output.dense.weight"
    state = state_module.DiffState.__new__(state_module.DiffState)
    state.candidate, state.candidate_label, state.notes = port, "candidate", []
    state.before_candidate = footprint.take(hf)
    state.candidate_sums = weight_sums(port)
    with torch.no_grad():  # the candidate's weight and the reference's, edited alike
        port.get_parameter(name).data *= 1.001
        hf.get_parameter(name).data *= 1.001
    relations = pairing.relate_parameters(hf, port)
    assert relations.same_bytes[name] == name
    state.reference_now = footprint.take(hf)
    candidate_flow.note_edited_weights(state, relations)
    assert f"edits its own weights ({name})" in " ".join(state.notes)
