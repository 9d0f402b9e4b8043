"""A backward PASS from each model's own backward, with nothing recorded (issue 41, part 6:
module gradients from the user's own backward; op-level backwards only where those fail).

Without node tables (``nodes=False``; ``introspect diff --backward`` without a report), the
first plain call of each side (autograd on) is differentiated on the diff's loss, and the
gradients its weights and its modules' outputs were handed decide a PASS
(``backward.plain_parity``). Anything they do not prove goes to the recorded path, which
names the node; where that path cannot record the candidate, weights paired by proof and
over budget decide the FAIL.

Ports: ``modular_ports.py`` (imports only torch; ``nn.Linear``/``nn.LayerNorm`` modules of
its own names, attention by hand), one training bug at a time, each by another route:
an ``autograd.Function``, a module global, a closure's hook, a full backward hook scaled by
a private attribute, a detach (inside an attention, of a block's output, in the model's
loop), a tensor hook inside a block's forward, ``.data`` in place, a class patched after the
build.
"""

from __future__ import annotations

import pytest
import torch

import introspect
from introspect.errors import InputError
from introspect.models.load import tokenize
from introspect.run.deferred import Deferred
from tests.backward import modular_ports
from tests.backward.test_backward import perturbed

_NOT_RECORDED = {"backward_hook", "class_patch"}  # the recorder cannot run their backward
# at a block's output: run in the first of bert-tiny's two blocks, so that one comes after
_AT_AN_OUTPUT = ("output_detach", "output_hook", "output_hook_inplace", "loop_detach")
_NOT_ALIKE = {"first_backward", "embed_checkpoint", *_AT_AN_OUTPUT}  # tests of their own


@pytest.fixture(scope="module")
def base():
    return perturbed("base")


def _diff(base, bug="", nodes=False, layer=1, **kwargs):
    hf, tokenizer = base
    try:
        return introspect.diff(hf, modular_ports.build(hf, bug, layer), tokenize(tokenizer),
                               backward=True, nodes=nodes, **kwargs)
    finally:
        modular_ports.undo()


def test_a_correct_port_passes_on_its_own_backward_with_nothing_recorded(base):
    result = _diff(base)
    b = result.backward
    assert result.passed and b.passed, result.summary()
    assert not result.op_level and b.rows == []  # no recording, no node gradient
    assert any(n.startswith("gradients from each model's own backward") for n in b.notes)
    # every weight of the reference compared, each within its budget (the port has no
    # pooler: the loss, of the hidden states, hands the reference's no gradient)
    hf = base[0]
    assert {r.reference for r in b.parameter_rows} == \
        {n for n, _ in hf.named_parameters() if not n.startswith("pooler.")}
    assert all(r.status == "ok" and r.relation == "same" for r in b.parameter_rows)
    worst = max(r.max_abs_err or 0.0 for r in b.parameter_rows)
    # attention by hand against sdpa: not bit-exact. The noise-model bound is each row's
    # own status above; 1e-4 is a sanity ceiling, 13x the 7.6e-6 measured with 1 and 2
    # threads and with ATEN_CPU_CAPABILITY=default
    assert 0 < worst < 1e-4
    assert abs(b.reference_loss - b.candidate_loss) <= 1e-6 * abs(b.reference_loss)


def test_the_scratch_port_passes_the_same_way(base):
    hf, tokenizer = base
    result = introspect.diff(hf, introspect.scratch.BertModel.from_hf(hf),
                             tokenize(tokenizer), backward=True, nodes=False)
    assert result.passed and not result.op_level, result.summary()
    assert result.backward.sgd_max_abs_err == 0.0  # bit-exact twin: the same gradients


def test_the_own_backward_leaves_every_grad_as_the_caller_had_it(base):
    hf, tokenizer = base
    port = modular_ports.build(hf)
    marked = next(iter(port.parameters()))
    marked.grad = torch.full_like(marked, 7.0)
    result = introspect.diff(hf, port, tokenize(tokenizer), backward=True, nodes=False)
    assert result.passed and not result.op_level
    assert all(p.grad is None for p in hf.parameters())
    assert bool((marked.grad == 7.0).all())
    assert all(p.grad is None for p in port.parameters() if p is not marked)


@pytest.mark.parametrize("bug", [b for b in modular_ports.BUGS
                                 if b not in _NOT_RECORDED and b not in _NOT_ALIKE])
def test_a_training_bug_fails_where_the_recorded_path_names_it(base, bug):
    """The own backward cannot prove the PASS; the recorded path then decides and names
    the same node as with node tables asked for."""
    fast, full = _diff(base, bug), _diff(base, bug, nodes=True)
    assert not fast.passed and not full.passed
    mine, theirs = fast.backward.first_divergence, full.backward.first_divergence
    assert mine is not None and theirs is not None
    assert (mine.reference_node, mine.parameter, mine.layer) == \
        (theirs.reference_node, theirs.parameter, theirs.layer)
    assert mine.layer == "encoder.layer.1"
    assert fast.first_divergence.layer == "encoder.layer.1"


@pytest.mark.parametrize("bug", _AT_AN_OUTPUT)
def test_a_gradient_cut_or_scaled_at_a_blocks_output_is_named_in_that_block(base, bug):
    """A detach of block 0's output (in the block, or in the model's loop) and a tensor
    hook that block's forward put on its output: the gradient block 1 hands back is right,
    and block 0 (or what comes before it) is where the port's backward parts. Probe round
    m named block 1: the local backward of its residual add lost its input's gradient (a
    cut), and the gradient read at block 0's output was the one the port's hook made."""
    fast, full = _diff(base, bug, layer=0), _diff(base, bug, nodes=True, layer=0)
    for result in (fast, full):
        assert not result.passed and not result.backward.passed
        d = result.backward.first_divergence
        assert d.layer == "encoder.layer.0", (bug, d)
        assert result.first_divergence.layer == "encoder.layer.0"
        assert d.candidate_module.startswith("blocks.0"), d
    hints = " ".join(fast.backward.first_divergence.hints)
    if bug.startswith("output_hook"):
        assert "times 1.05" in hints, hints
    else:
        assert "cuts the graph" in hints and "no gradient reached it" in hints, hints


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("nodes", [False, True], ids=["own-backward", "node-tables"])
def test_a_reentrant_checkpoint_that_leaves_the_embeddings_untrained_says_so(base, nodes):
    """Reentrant checkpointing around the embeddings, whose inputs are token ids only: the
    checkpoint hands back a value with no gradient, so the embeddings never train (a true
    FAIL). Probe round m named it in encoder.layer.0, with a hint on a cut graph that did
    not say what cut it."""
    result = _diff(base, "embed_checkpoint", nodes=nodes)
    assert not result.passed and not result.backward.passed
    d = result.backward.first_divergence
    assert d.layer == "embeddings" and d.candidate_module.startswith("embed"), d
    assert result.first_divergence.layer == "embeddings"
    said = [h for h in d.hints if "ran with autograd off" in h]
    assert len(said) == 1 and said[0].startswith("the candidate's embed ran"), d.hints
    assert "use_reentrant=True" in said[0] and result.first_divergence.hints == d.hints


def test_a_cut_where_autograd_stayed_on_gets_no_such_hint(base):
    result = _diff(base, "output_detach", layer=0)
    assert not any("ran with autograd off" in h
                   for h in result.backward.first_divergence.hints)


@pytest.mark.parametrize("bug", sorted(_NOT_RECORDED))
def test_a_bug_the_recorder_cannot_run_fails_on_its_proven_weights(base, bug):
    """A full backward hook and an identity ``Function`` returning a view break the
    gradient recorder; the weights paired by proof decide from the own backwards instead,
    with node tables too (taken then after the recording failed: ``own_gradients_late``)."""
    result = _diff(base, bug)
    assert not result.passed and not result.backward.passed
    d = result.backward.first_divergence
    assert d.parameter.startswith("encoder.layer.1.") and d.layer == "encoder.layer.1"
    assert d.candidate_module.startswith("blocks.1.")
    assert result.first_divergence.layer == "encoder.layer.1"
    assert any("could not be recorded with autograd on" in n for n in result.backward.notes)
    tables = _diff(base, bug, nodes=True)  # the same verdict, with the forward's tables
    assert not tables.passed and not tables.backward.passed
    assert tables.backward.first_divergence.parameter == d.parameter
    assert tables.first_divergence.layer == "encoder.layer.1"


def _patched_gelu_backward(reference):
    """A build that makes the reference's GELU (HF's ``GELUActivation``) differentiate
    without its ``x * pdf(x)`` term, and computes the same itself: against a reference
    recorded after it, the two would agree."""
    from transformers.activations import GELUActivation

    def forward(self, x):
        return modular_ports._HalfGelu.apply(x)

    GELUActivation.forward = forward
    port = modular_ports.build(reference, "gelu_backward", layer=0)
    for block in port.blocks:
        block.ffn.act.how = "gelu_backward"
    return port


def test_a_build_that_changes_the_references_backward_gets_no_verdict(base):
    from transformers.activations import GELUActivation

    hf, tokenizer = base
    kept = GELUActivation.forward
    try:
        with pytest.raises(InputError, match="changed how the reference differentiates"):
            introspect.diff(hf, Deferred(lambda: _patched_gelu_backward(hf)),
                            tokenize(tokenizer), backward=True, nodes=False)
    finally:
        GELUActivation.forward = kept


@pytest.mark.slow
def test_reentrant_checkpointing_falls_back_and_passes(base):
    """Inside a reentrant checkpoint the forward runs without autograd: no module output
    there is handed a gradient, the own backward proves nothing, and the recorded path
    (which compares what autograd hands each side) passes it."""
    from tests.ports import bert_checkpointed

    hf, tokenizer = base
    result = introspect.diff(hf, bert_checkpointed.build(hf, reentrant=True),
                             tokenize(tokenizer), backward=True, nodes=False)
    assert result.passed, result.summary()
    assert result.backward.rows  # decided node by node


def test_a_backward_wrong_on_the_first_call_only_fails_on_its_proof(base):
    """The own backward (the first call's) proves weights over budget; the recorded one, a
    later call, agrees: the proof stands, and the note says the backward changes from call
    to call (a user's first step would train otherwise)."""
    result = _diff(base, "first_backward")
    b = result.backward
    assert not result.passed and not b.passed
    # the weight (the handed gradients part in its own layer: ``backward.parting`` names
    # only another layer)
    assert b.first_divergence.parameter.startswith("encoder.layer.1.")
    assert b.first_divergence.layer == "encoder.layer.1"
    assert any("changes from call to call" in n for n in b.notes)
    assert result.first_divergence.layer == "encoder.layer.1"
