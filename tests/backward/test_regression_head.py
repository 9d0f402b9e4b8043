"""A regression head (HF's ``num_labels=1``) under ``--backward``: its default loss is a
mean squared error against seeded targets, as HF trains such a head. It took the
cross-entropy over one class, which has no gradient, and a correct port was refused
(probe round m). The port is ``ports.py``'s, written by hand; its bug changes only the
backward."""

from __future__ import annotations

import pytest
import torch
import transformers

import introspect
from introspect.diff.backward.losses import default_loss
from introspect.models.load import load_model, tokenize
from tests.backward import ports


@pytest.fixture(scope="module")
def regression():
    loaded = load_model("bert-tiny", head="sequence-classification")
    fields = {k: v for k, v in loaded.model.config.to_dict().items()
              if k not in ("id2label", "label2id")}
    config = loaded.model.config.__class__.from_dict({**fields, "num_labels": 1})
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every LayerNorm and bias off (1, 0): faults cannot hide
        for name, p in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return model, loaded.tokenizer


def test_the_loss_of_one_label_is_a_mean_squared_error():
    scores = torch.randn(3, 1, generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss = default_loss("sequence-classification")({"logits": scores}, {})
    loss.backward()
    assert loss.grad_fn.name().startswith("MseLoss")
    assert scores.grad is not None and bool((scores.grad != 0).all())


@pytest.mark.parametrize("bug", [None, "custom_gelu"])
def test_a_regression_head_is_judged_not_refused(regression, bug):
    model, tokenizer = regression
    result = introspect.diff(model, ports.build(model, bug, layer=1), tokenize(tokenizer),
                             backward=True, nodes=False)
    assert result.backward is not None and result.backward.loss == "sequence-classification"
    if bug is None:
        assert result.passed, result.summary()
        return
    assert not result.passed
    assert result.first_divergence.layer == "encoder.layer.1", result.first_divergence
