"""Model sources of the cousins: random-init names, checkpoint folders, heads, inputs."""

from __future__ import annotations

import sys

import pytest
import torch

from introspect.errors import ModelSourceError
from introspect.models.families import FAMILIES, RANDOM_MODELS
from introspect.models.load import check_model_source, load_model, tokenize
from tests import launch
from tests.fixtures.families import tiny_model


def test_every_random_name_has_its_family_and_its_layer_count():
    assert check_model_source("distilbert-base") == 6
    assert check_model_source("gpt2") == 12
    assert check_model_source("llama-tiny") == 4
    assert set(RANDOM_MODELS.values()) == set(FAMILIES)


def test_a_random_cousin_is_seeded_and_sized_to_the_embedded_vocab():
    first, second = load_model("llama-tiny", head="causal-lm"), load_model("llama-tiny")
    assert type(first.model).__name__ == "LlamaForCausalLM"
    assert first.model.config.vocab_size == 30522 and first.model.config.use_cache is False
    assert torch.equal(first.model.model.embed_tokens.weight, second.model.embed_tokens.weight)
    assert any("use_cache=False" in note for note in first.notes)
    assert any("WordPiece" in note for note in first.notes)


@pytest.mark.parametrize(("family", "names"), [
    ("distilbert", ["input_ids", "attention_mask"]),
    ("gpt2", ["input_ids", "attention_mask"]),
    ("roberta", ["input_ids", "attention_mask"]),
    ("electra", ["input_ids", "token_type_ids", "attention_mask"]),
])
def test_inputs_are_those_the_family_takes(family, names):
    from introspect.models.load import _load_tokenizer, minilm_folder

    tokens = tokenize(_load_tokenizer(minilm_folder(), FAMILIES[family]))
    assert list(tokens.tensors) == names


def test_a_head_the_family_lacks_is_one_line():
    with pytest.raises(ModelSourceError, match=r"gpt2 \(gpt2\) has no masked-lm head in "
                                               r"transformers; its heads: base, "):
        load_model("gpt2", head="masked-lm")
    with pytest.raises(ModelSourceError, match="bert-tiny .* no causal-lm head|unknown head"):
        load_model("bert-tiny", head="causal-lm")


def test_a_head_the_family_lacks_exits_2_through_the_real_cli():
    done = launch.run([sys.executable, "-m", "introspect", "trace", "--model",
                       "distilbert-base", "--head", "causal-lm"],
                      capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "has no causal-lm head" in done.stderr


@pytest.mark.parametrize(("family", "head"), [("gpt2", "causal-lm"), ("distilbert", "masked-lm"),
                                              ("albert", "sequence-classification")])
def test_a_checkpoint_folder_of_a_cousin_loads_with_its_weights(tmp_path, family, head):
    saved = tiny_model(family, head, seed=3)
    saved.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text(  # a WordPiece vocab of the model's own size
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                  + [f"w{i}" for i in range(saved.config.vocab_size - 5)]) + "\n")
    loaded = load_model(tmp_path, head=head)
    assert type(loaded.model) is type(saved)
    for (name, a), b in zip(saved.state_dict().items(), loaded.model.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name


def test_a_cousin_folder_without_a_wordpiece_vocab_of_its_size_is_refused(tmp_path):
    tiny_model("albert", vocab_size=30000).save_pretrained(tmp_path)
    with pytest.raises(ModelSourceError,
                       match=r"no vocab.txt, and its vocab_size 30000 is smaller"):
        load_model(tmp_path)
