"""Bit-exact parity with HuggingFace transformers on CPU fp32, head by head.

Same attention path on both sides: ``torch.equal`` on every output (hidden states, pooler
output, logits, loss). Mixed paths (HF sdpa vs scratch eager): within the fp32 budget.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import introspect.scratch as scratch
from tests.bounds import assert_close
from tests.scratch.conftest import (
    BASE,
    HEADS,
    assert_equal_outputs,
    hf_model,
    make_inputs,
    quiet_from_hf,
    transformers,
)

FP32 = dict(rtol=1.3e-6, atol=1e-5)


def labels_for(
    head: str, inputs: dict[str, torch.Tensor], vocab_size: int = 30522, num_labels: int = 2
) -> dict[str, torch.Tensor]:
    """Labels of the right kind for each head, with ignored (-100, out-of-range) entries."""
    g = torch.Generator().manual_seed(7)
    ids = inputs["input_ids"]
    B, S = ids.shape[0], ids.shape[-1]
    token_labels = torch.randint(0, vocab_size, (B, S), generator=g)
    token_labels[:, ::3] = -100
    if head == "BertForPreTraining":
        return {"labels": token_labels, "next_sentence_label": torch.tensor([0, 1])}
    if head == "BertForMaskedLM":
        return {"labels": token_labels}
    if head == "BertForNextSentencePrediction":
        return {"labels": torch.tensor([1, 0])}
    if head == "BertForSequenceClassification":
        return {"labels": torch.randint(0, num_labels, (B,), generator=g)}
    if head == "BertForMultipleChoice":
        return {"labels": torch.tensor([2, 0])}
    if head == "BertForTokenClassification":
        return {"labels": token_labels % num_labels}
    if head == "BertForQuestionAnswering":  # one in range, one past the end (ignored)
        return {
            "start_positions": torch.tensor([1, S + 5]),
            "end_positions": torch.tensor([[3], [4]]),
        }
    return {}


def run_both(
    hf: torch.nn.Module, model: torch.nn.Module, inputs: dict[str, Any]
) -> tuple[Any, Any]:
    with torch.no_grad():
        return hf(**inputs), model(**inputs)


# -- bert-tiny, every head, both attention paths, loaded from a saved folder --------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("head", HEADS)
def test_every_head_is_bit_exact_on_bert_tiny(head: str, attn: str, tmp_path: Any) -> None:
    hf = hf_model(head, attn=attn)
    hf.save_pretrained(tmp_path)
    model = getattr(scratch, head).from_pretrained(tmp_path, attn_implementation=attn, strict=True)
    assert model.config.attn_implementation == attn
    for padded in (False, True):
        inputs = make_inputs(head, padded=padded)
        inputs.update(labels_for(head, inputs))
        hf_out, out = run_both(hf, model, inputs)
        assert_equal_outputs(hf_out, out)
        assert set(out) == {k for k, v in hf_out.items() if v is not None}


def test_without_mask_and_token_types_is_bit_exact() -> None:
    hf = hf_model("BertModel")
    model = quiet_from_hf(scratch.BertModel, hf)
    ids = make_inputs()["input_ids"]
    assert_equal_outputs(*run_both(hf, model, {"input_ids": ids}))


def test_explicit_position_ids_are_bit_exact() -> None:
    hf = hf_model("BertModel")
    model = quiet_from_hf(scratch.BertModel, hf)
    inputs = make_inputs()
    inputs["position_ids"] = torch.arange(9).flip(0).expand(2, 9)
    assert_equal_outputs(*run_both(hf, model, inputs))


def test_hidden_states_are_bit_exact() -> None:
    hf = hf_model("BertForSequenceClassification")
    model = quiet_from_hf(scratch.BertForSequenceClassification, hf)
    inputs = {**make_inputs(), "output_hidden_states": True}
    hf_out, out = run_both(hf, model, inputs)
    assert len(out.hidden_states) == 3  # embeddings + 2 layers
    assert_equal_outputs(hf_out, out)


# -- sequence-classification losses, chosen like HF -------------------------------------------


@pytest.mark.parametrize(
    ("num_labels", "problem_type", "labels"),
    [
        (3, None, torch.tensor([2, 0])),  # integer labels: single-label cross-entropy
        (
            3,
            None,
            torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
        ),  # float labels: multi-label BCE
        (1, None, torch.tensor([0.5, -1.25])),  # one label: regression (MSE)
        (2, "regression", torch.tensor([[0.5, 2.0], [1.0, -1.0]])),  # regression on 2 outputs
        (3, "multi_label_classification", torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])),
        (3, "single_label_classification", torch.tensor([1, 2])),
    ],
)
def test_sequence_classification_loss_is_chosen_and_computed_like_hf(
    num_labels: int, problem_type: str | None, labels: torch.Tensor
) -> None:
    hf = hf_model("BertForSequenceClassification", num_labels=num_labels, problem_type=problem_type)
    model = quiet_from_hf(scratch.BertForSequenceClassification, hf)
    inputs = {**make_inputs(), "labels": labels}
    hf_out, out = run_both(hf, model, inputs)
    assert out.loss is not None
    assert_equal_outputs(hf_out, out)
    assert model.config.problem_type == problem_type  # never changed by a forward pass


# -- non-default configs, saved to a folder and loaded ----------------------------------------

ODD_CONFIGS = [
    dict(
        hidden_size=96,
        num_attention_heads=3,
        intermediate_size=200,
        num_hidden_layers=3,
        type_vocab_size=16,
        layer_norm_eps=1e-5,
        vocab_size=500,
        max_position_embeddings=64,
    ),
    dict(
        hidden_size=64,
        num_attention_heads=8,
        intermediate_size=100,
        num_hidden_layers=1,
        type_vocab_size=16,
        layer_norm_eps=1e-7,
        vocab_size=300,
        hidden_act="gelu_new",
        num_labels=5,
        tie_word_embeddings=False,
    ),
    dict(
        hidden_size=48,
        num_attention_heads=4,
        intermediate_size=72,
        num_hidden_layers=2,
        type_vocab_size=16,
        layer_norm_eps=1e-6,
        vocab_size=200,
        hidden_act="relu",
        num_labels=3,
        classifier_dropout=0.3,
        pad_token_id=3,
    ),
]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "config", ODD_CONFIGS, ids=["h96-nh3-tv16", "h64-nh8-gelu_new-untied", "h48-nh4-relu"]
)
def test_every_head_is_bit_exact_on_non_default_configs(
    config: dict[str, Any], attn: str, tmp_path: Any
) -> None:
    for head in HEADS:
        head_config = {**config, "num_labels": 2} if head == "BertForQuestionAnswering" else config
        hf = hf_model(head, seed=3, attn=attn, **head_config)
        hf.save_pretrained(tmp_path / head)
        model = getattr(scratch, head).from_pretrained(
            tmp_path / head, attn_implementation=attn, strict=True
        )
        inputs = make_inputs(head, vocab_size=config["vocab_size"], type_vocab_size=16, seq=11)
        inputs.update(
            labels_for(head, inputs, config["vocab_size"], head_config.get("num_labels", 2))
        )
        assert_equal_outputs(*run_both(hf, model, inputs))


# -- the real pretrained MiniLM ----------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_hf(minilm_folder: str) -> dict[str, torch.nn.Module]:
    """HF's MiniLM base model and two heads on it (heads drawn by HF from seed 0)."""
    models = {}
    for head in ("BertModel", "BertForMaskedLM", "BertForSequenceClassification"):
        torch.manual_seed(0)
        models[head] = getattr(transformers, head).from_pretrained(minilm_folder).eval()
    return models


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_minilm_base_model_is_bit_exact(minilm_folder: str, minilm_hf: dict, attn: str) -> None:
    hf = minilm_hf["BertModel"]
    hf.set_attn_implementation(attn)
    model = scratch.BertModel.from_pretrained(minilm_folder, attn_implementation=attn, strict=True)
    assert model.loading_report.ignored_buffers == ("embeddings.position_ids",)
    for padded in (False, True):
        assert_equal_outputs(*run_both(hf, model, make_inputs(padded=padded, seq=16)))


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_minilm_heads_are_bit_exact(minilm_hf: dict, head: str) -> None:
    hf = minilm_hf[head]
    hf.set_attn_implementation("sdpa")
    model = quiet_from_hf(getattr(scratch, head), hf)
    inputs = make_inputs(seq=16)
    inputs.update(labels_for(head, inputs))
    assert_equal_outputs(*run_both(hf, model, inputs))


# -- sdpa against eager: not bit-exact, within the fp32 budget ---------------------------------


def test_mixing_attention_paths_stays_within_the_fp32_budget(
    minilm_folder: str, minilm_hf: dict
) -> None:
    inputs = make_inputs(seq=16)
    for hf_attn, scratch_attn in (("sdpa", "eager"), ("eager", "sdpa")):
        hf = minilm_hf["BertModel"]
        hf.set_attn_implementation(hf_attn)
        model = scratch.BertModel.from_pretrained(minilm_folder, attn_implementation=scratch_attn)
        hf_out, out = run_both(hf, model, inputs)
        for name in out:
            assert_close(out[name], hf_out[name], **FP32, what=f"{hf_attn} {name}")


# -- gradients -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        "BertForPreTraining",
        "BertForSequenceClassification",
        "BertForQuestionAnswering",
        "BertForMultipleChoice",
    ],
)
def test_gradients_match_hf(head: str) -> None:
    hf = hf_model(head, vocab_size=1000)  # bert-tiny with a small vocabulary: fast backward
    model = quiet_from_hf(getattr(scratch, head), hf)
    inputs = make_inputs(head, vocab_size=1000)
    inputs.update(labels_for(head, inputs, vocab_size=1000))
    hf(**inputs).loss.backward()
    model(**inputs).loss.backward()
    hf_params = dict(hf.named_parameters())
    checked = 0
    for name, param in model.named_parameters():
        expected = hf_params[name].grad
        if expected is None:  # e.g. the unused pooler of a head without one
            assert param.grad is None
            continue
        assert_close(param.grad, expected, **FP32, what=name, msg=lambda m, n=name: f"{n}: {m}")
        checked += 1
    assert checked == len(hf_params) - sum(p.grad is None for p in hf_params.values())


# -- bert-base (slow) ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("head", "attn"), [("BertModel", "sdpa"), ("BertForSequenceClassification", "eager")]
)
def test_bert_base_is_bit_exact(head: str, attn: str) -> None:
    hf = hf_model(head, attn=attn, **BASE)
    model = quiet_from_hf(getattr(scratch, head), hf)
    inputs = make_inputs(seq=32)
    inputs.update(labels_for(head, inputs))
    assert_equal_outputs(*run_both(hf, model, inputs))
