"""Model sources load offline, and every bad source fails with a clear error."""

from __future__ import annotations

import json

import pytest
import torch

from introspect.errors import InputError, ModelSourceError
from introspect.load import DEFAULT_TEXTS, load_model, minilm_folder, tokenize


def test_minilm_is_the_real_pretrained_checkpoint(minilm):
    config = minilm.model.config
    sizes = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads)
    assert sizes == (384, 6, 12)
    assert minilm.folder == minilm_folder()
    assert not minilm.model.training
    inputs = tokenize(minilm.tokenizer)
    assert inputs.tokens[0][:6] == ("[CLS]", "i", "love", "cats", "!", "[SEP]")
    assert inputs.tokens[0][-1] == "[PAD]"
    assert inputs.tensors["input_ids"].shape == inputs.tensors["attention_mask"].shape


def test_random_models_are_seeded_and_identical_across_loads():
    first = load_model("bert-tiny").model.state_dict()
    second = load_model("bert-tiny").model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_missing_head_weights_are_seeded_and_reported():
    a = load_model("minilm", head="sequence-classification")
    b = load_model("minilm", head="sequence-classification")
    assert torch.equal(a.model.classifier.weight, b.model.classifier.weight)
    assert any("classifier.weight" in note for note in a.notes)


def test_local_folder_checkpoint(tmp_path, tiny_models):
    tiny_models("masked-lm").model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), head="masked-lm", attn="eager")
    assert loaded.folder == tmp_path
    assert any("vocab" in note for note in loaded.notes)  # no tokenizer files: embedded vocab


@pytest.mark.parametrize("source, message", [
    ("gpt-9", "unknown model 'gpt-9'"),
    ("bert-base-uncased", "models are never downloaded"),
])
def test_unknown_model_names(source, message):
    with pytest.raises(ModelSourceError, match=message):
        load_model(source)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelSourceError, match="has no config.json"):
        load_model(str(tmp_path))


def test_non_bert_architecture_says_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelSourceError, match="holds a gpt2 model; only BERT"):
        load_model(str(tmp_path))


def test_config_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelSourceError, match="no weights"):
        load_model(str(tmp_path))


def test_unknown_head_and_attention():
    with pytest.raises(ModelSourceError, match="unknown head 'summarise'; choose one of: base"):
        load_model("bert-tiny", head="summarise")
    with pytest.raises(ModelSourceError, match="unknown attention implementation 'flash'"):
        load_model("bert-tiny", attn="flash")


def test_tokenize_refuses_empty_text_and_truncates_long_text(minilm):
    with pytest.raises(InputError, match="text 2 is empty"):
        tokenize(minilm.tokenizer, ["fine", "  "])
    with pytest.raises(InputError, match="no text given"):
        tokenize(minilm.tokenizer, [])
    long = tokenize(minilm.tokenizer, ["word " * 600], max_length=512)
    assert long.tensors["input_ids"].shape == (1, 512)
    assert long.notes == ["input 1 has 602 tokens; truncated to 512"]


def test_heads_that_shape_their_inputs(minilm):
    pairs = tokenize(minilm.tokenizer, DEFAULT_TEXTS, head="next-sentence")
    assert pairs.tensors["input_ids"].shape[0] == 1
    assert set(pairs.tensors["token_type_ids"][0].tolist()) == {0, 1}
    with pytest.raises(InputError, match="in pairs; got 3 texts"):
        tokenize(minilm.tokenizer, ["a", "b", "c"], head="next-sentence")
    choices = tokenize(minilm.tokenizer, DEFAULT_TEXTS, head="multiple-choice")
    assert choices.tensors["input_ids"].shape[:2] == (1, 2)
