"""Gradient parity (``diff(..., backward=True)``): correct ports pass, each training bug of
``tests/backward/ports.py`` fails at its node or weight with its hint (or none)."""

from __future__ import annotations

import pytest
import torch

import introspect
import introspect.scratch as scratch
from introspect.diff.backward.losses import _mlm_labels
from introspect.errors import InputError
from introspect.models.load import load_model, tokenize
from tests.backward import ports
from tests.bounds import below, longest_reduction, rounding_bound
from tests.conftest import make_batch

SCRATCH = {"base": "BertModel", "masked-lm": "BertForMaskedLM",
           "sequence-classification": "BertForSequenceClassification",
           "token-classification": "BertForTokenClassification",
           "question-answering": "BertForQuestionAnswering",
           "multiple-choice": "BertForMultipleChoice",
           "next-sentence": "BertForNextSentencePrediction",
           "pretraining": "BertForPreTraining"}


def perturbed(head: str, attn: str = "sdpa") -> tuple[torch.nn.Module, object]:
    """bert-tiny with every LayerNorm and bias moved off (1, 0): faults cannot hide."""
    loaded = load_model("bert-tiny", head=head, attn=attn)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in loaded.model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return loaded.model, loaded.tokenizer


@pytest.fixture(scope="module")
def mlm():
    return perturbed("masked-lm")


def _inputs(head: str, tokenizer) -> dict[str, torch.Tensor]:
    if head == "multiple-choice":
        return make_batch(2, 8, padded=True, choices=2)
    return dict(tokenize(tokenizer).tensors)


@pytest.mark.parametrize("head", [
    "base", "masked-lm",
    pytest.param("sequence-classification", marks=pytest.mark.slow),
    pytest.param("token-classification", marks=pytest.mark.slow),
    pytest.param("question-answering", marks=pytest.mark.slow),
    pytest.param("multiple-choice", marks=pytest.mark.slow),
    pytest.param("next-sentence", marks=pytest.mark.slow),
    pytest.param("pretraining", marks=pytest.mark.slow),
])
def test_scratch_against_hf_every_head(head):
    hf, tokenizer = perturbed(head)
    port = getattr(scratch, SCRATCH[head]).from_hf(hf)
    result = introspect.diff(hf, port, _inputs(head, tokenizer), backward=True)
    b = result.backward
    assert result.passed, result.summary()
    assert b.passed and b.first_divergence is None
    assert below(abs(b.reference_loss / b.candidate_loss - 1), 1e-6, "loss")
    assert len(b.rows) > 20 and len(b.parameter_rows) >= 39
    assert all(r.status == "ok" for r in b.parameter_rows), b.parameter_table()
    assert not [r for r in b.rows if r.status == "fail"]
    # every weight has its gradient compared, and the step agrees at float noise
    assert below(b.sgd_max_abs_err, 1e-8, "sgd step")
    frame = result.parameters
    assert list(frame.columns[:3]) == ["reference", "candidate", "relation"]
    assert len(frame) == len(b.parameter_rows)


@pytest.mark.numeric
def test_correct_hand_written_port_passes(mlm):
    hf, tokenizer = mlm
    result = introspect.diff(hf, ports.build(hf), tokenize(tokenizer), backward=True)
    assert result.passed, result.summary()
    b = result.backward
    assert b.loss == "masked-lm"
    # attention by hand against sdpa: not bit-exact, within the budget
    worst = max(r.max_abs_err or 0 for r in b.parameter_rows)
    assert 0 < worst and below(worst, 1e-5, "gradients")
    assert {r.candidate for r in b.parameter_rows if "word_embeddings" in r.reference} == \
        {"p.embeddings__word_embeddings__weight"}


# bug -> (reference node or "param:NAME", module of the divergence, hint words or None)
EXPECTED = {
    "custom_gelu": ("bert_encoder_layer_1_intermediate_intermediate_act_fn", None),
    # the value detached (the residual add's own backward is right: what it hands back is
    # let go before it reaches that value)
    "detach": ("bert_encoder_layer_1_attention_output_dense", "exactly zero in the candidate"),
    "inplace": ("scaled_dot_product_attention_1", "exactly zero in the candidate"),
    "scaled_hook": ("bert_encoder_layer_1_intermediate_dense", "times 8"),
    "untied": ("param:bert.embeddings.word_embeddings.weight", "tied in the reference"),
    "dropout": ("scaled_dot_product_attention_1", None),
}


@pytest.mark.parametrize("bug", [
    "custom_gelu", "detach", "inplace",
    pytest.param("scaled_hook", marks=pytest.mark.slow),
    pytest.param("untied", marks=pytest.mark.slow),
    pytest.param("dropout", marks=pytest.mark.slow),
])
def test_training_bug_found_at_its_node(mlm, bug):
    hf, tokenizer = mlm
    result = introspect.diff(hf, ports.build(hf, bug, layer=1), tokenize(tokenizer),
                             backward=True)
    b = result.backward
    assert not result.passed and not b.passed
    where, words = EXPECTED[bug]
    d = b.first_divergence
    assert d is not None, b.summary()
    if where.startswith("param:"):
        assert d.parameter == where.removeprefix("param:"), b.summary()
    else:
        assert d.reference_node == where, b.summary()
    if words is None:  # (a dropout that dropped nothing at the node: its 1/(1-p) is named)
        assert not any("times" in h and "dropout" not in h or "tied" in h
                       for h in d.hints), d.hints
    else:
        assert any(words in h for h in d.hints), d.hints
    if bug in ("custom_gelu", "detach", "inplace", "scaled_hook", "untied"):
        # the forward agrees: the backward's divergence decides, and is the result's
        assert result.first_divergence.phase == "backward" and result.failed_in == "backward"
        assert result.first_divergence.reference_node == d.reference_node


def test_loss_over_padded_labels(mlm):
    """The models' own losses (labels in the inputs): the port counts the -100 positions."""
    hf, tokenizer = mlm
    tensors = dict(tokenize(tokenizer).tensors)
    tensors["labels"] = _mlm_labels(tensors, tensors["input_ids"].shape)
    good = introspect.diff(hf, ports.build(hf), tensors, backward=True)
    assert good.backward.loss == "own-loss" and good.passed, good.summary()
    bad = introspect.diff(hf, ports.build(hf, "padded_loss"), tensors, backward=True)
    d = bad.backward.first_divergence
    assert d is not None and d.reference_node == "cross_entropy"
    assert any("flows into positions the reference's loss ignores" in h for h in d.hints)


@pytest.mark.slow
@pytest.mark.numeric
def test_float64_bounds_the_noise(mlm):
    """Both sides in float64: the hand-written port's gradients agree to ~1e-15; the noise
    budget (a float64 reference) keeps a correct float32 port passing and a bug failing."""
    hf, tokenizer = mlm
    inputs = tokenize(tokenizer)
    exact = introspect.diff(hf.double(), ports.build(hf), inputs, backward=True)
    hf.float()
    assert exact.passed, exact.backward.parameter_table()
    # Each weight's gradient within what float64 rounding can do at its scale (tests/bounds.py;
    # 3.4e-11 of it here, measured ~1e-15). Not each element's relative error: an element
    # that cancels to ~0 keeps its terms' error (2.3e-9 with ATEN_CPU_CAPABILITY=default).
    reduction = longest_reduction(hf.config, inputs.tensors["input_ids"].numel())  # vocab
    rows = exact.backward.parameter_rows
    floor = rounding_bound("float64", reduction, max(r.reference_max_abs for r in rows))
    for r in rows:  # under the floor: zero but for rounding (key biases: softmax ignores them)
        if r.reference_max_abs > floor:
            bound = rounding_bound("float64", reduction, r.reference_max_abs)
            assert below(r.max_abs_err, bound, r.reference), exact.backward.parameter_table()
    noisy = introspect.diff(hf, ports.build(hf), inputs, backward=True, noise_budget=True)
    assert noisy.passed, noisy.summary()
    assert any("float64" in n for n in noisy.backward.notes)
    broken = introspect.diff(hf, ports.build(hf, "custom_gelu", layer=1), inputs, backward=True,
                             noise_budget=True)
    assert broken.backward.first_divergence.reference_node == \
        "bert_encoder_layer_1_intermediate_intermediate_act_fn"


def test_user_loss_for_both_sides(mlm):
    hf, tokenizer = mlm
    seen = []

    def loss(outputs, inputs):
        seen.append(sorted(inputs))
        return outputs[0][..., :7].pow(2).mean()

    result = introspect.diff(hf, ports.build(hf), tokenize(tokenizer), backward=True, loss=loss)
    assert result.backward.loss == "user" and result.passed
    # each side's recorded backward, then each side's own backward, which holds a
    # recorded PASS (node tables asked for: the plain calls took none)
    assert len(seen) == 4 and all("attention_mask" in names for names in seen)


def test_bad_loss_is_input_error(mlm):
    hf, tokenizer = mlm
    inputs = tokenize(tokenizer)
    with pytest.raises(InputError, match="loss= is used only with backward=True"):
        introspect.diff(hf, ports.build(hf), inputs, loss=lambda o, i: o[0].sum())
    with pytest.raises(InputError, match="loss must be a callable"):
        introspect.diff(hf, ports.build(hf), inputs, backward=True, loss="mse")
    with pytest.raises(InputError, match="scalar tensor"):
        introspect.diff(hf, ports.build(hf), inputs, backward=True, loss=lambda o, i: o[0])


def test_parameters_needs_backward(mlm):
    hf, tokenizer = mlm
    result = introspect.diff(hf, ports.build(hf), tokenize(tokenizer))
    with pytest.raises(AttributeError, match="backward=True"):
        _ = result.parameters


def test_embedding_without_padding_idx(mlm):
    """A loss that reaches padded positions: HF's pad row never trains, the port's does."""
    hf, tokenizer = mlm

    def everywhere(outputs, inputs):  # padded positions count; the pad token's logit not
        return outputs[0][..., 1000:1007].pow(2).mean()

    inputs = tokenize(tokenizer)
    result = introspect.diff(hf, ports.build(hf, "no_padding_idx"), inputs, backward=True,
                             loss=everywhere)
    d = result.backward.first_divergence
    assert d is not None and d.parameter == "bert.embeddings.word_embeddings.weight"
    assert any("row(s) 0 " in h and "padding_idx" in h for h in d.hints), d.hints
    # a weight's gradient names the reference's layer, the candidate's module beside it
    assert d.layer == "embeddings" and d.candidate_module, d
    assert result.first_divergence.layer == "embeddings"
    assert "(in embeddings; the candidate's " in result.backward.summary()


def test_equal_weights_pair_by_the_nodes_that_read_them_not_by_their_gradients():
    """Random init leaves every bias at 0 and every LayerNorm at (1, 0): many weights hold
    equal values. Each reference weight's partner is the one aligned nodes read with it;
    choosing by the closest gradient paired layer 0's output LayerNorm bias with its dense
    bias once a fault made the gradients differ."""
    loaded = load_model("bert-tiny", head="masked-lm")  # not perturbed: the ties are the point
    inputs = tokenize(loaded.tokenizer)
    for bug in (None, "custom_gelu"):
        port = ports.build(loaded.model, bug, layer=1)
        rows = introspect.diff(loaded.model, port, inputs, backward=True).backward.parameter_rows
        encoder = [r for r in rows if r.reference.startswith("bert.encoder.")]
        assert len(encoder) == 32, [r.reference for r in rows]
        for r in encoder:
            assert r.candidate == "p." + r.reference.removeprefix("bert.").replace(".", "__"), \
                (bug, r.reference, r.candidate)


def test_a_node_that_returns_its_input_has_the_identity_as_its_local_backward(mlm):
    """HF's dropout in eval returns its input itself, so its value is its input's autograd
    value: its local backward is the identity. A port whose dropout (hand-written, as other
    frameworks write it) passes; one whose dropout scales the gradient by 2 in its backward
    only fails there with the scale hint. The walk used to start from the input's own
    function instead: it ran the network behind it and blamed "exactly zero in the reference
    (detached)" on the reference."""
    from tests.backward import hand_dropout_port

    hf, tokenizer = mlm
    inputs = tokenize(tokenizer)
    assert introspect.diff(hf, hand_dropout_port.build(hf), inputs, backward=True).passed
    result = introspect.diff(hf, hand_dropout_port.build(hf, wrong_scale=True), inputs,
                             backward=True)
    divergence = result.backward.first_divergence
    assert not result.passed and divergence is not None
    assert divergence.module.endswith("output.dropout")
    assert any("times 2" in hint for hint in divergence.hints)
    assert not any("zero" in hint for hint in divergence.hints)
