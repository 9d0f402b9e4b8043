"""Loading HF checkpoints: folders, file formats, key names, reports, and every error."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import introspect.scratch as scratch
from introspect.errors import IntrospectError, ModelSourceError
from tests.scratch.conftest import assert_equal_outputs, hf_model, make_inputs, quiet_from_hf

SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    vocab_size=120,
    max_position_embeddings=32,
)


def saved(folder: Path, head: str = "BertModel", **config: Any) -> Path:
    """A small HF checkpoint folder of ``head``."""
    hf_model(head, **{**SMALL, **config}).save_pretrained(folder)
    return folder


def rewrite_weights(folder: Path, change: Any) -> None:
    """Apply ``change`` to the folder's state dict and write it back."""
    state = load_file(folder / "model.safetensors")
    change(state)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})


def small_inputs() -> dict[str, torch.Tensor]:
    return make_inputs(vocab_size=SMALL["vocab_size"])


# -- what a user gets ------------------------------------------------------------------------


def test_from_pretrained_gives_an_eval_model_with_a_report(tmp_path: Path) -> None:
    model = scratch.BertForSequenceClassification.from_pretrained(
        saved(tmp_path, "BertForSequenceClassification")
    )
    assert not model.training
    assert all(not m.training for m in model.modules())
    report = model.loading_report
    assert "classifier.weight" in report.loaded and report.initialized == report.unused == ()
    with torch.no_grad():
        out = model(**small_inputs())
    assert out.logits.shape == (2, 2) and out.loss is None
    assert str(report).startswith(f"loaded {len(report.loaded)} parameters from")


def test_base_checkpoint_into_a_head_initialises_the_head_from_a_fixed_seed(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    with pytest.warns(
        scratch.LoadingWarning, match=r"drawn from seed 0: classifier\.weight, classifier\.bias"
    ):
        first = scratch.BertForSequenceClassification.from_pretrained(folder)
    torch.manual_seed(1234)  # the global RNG has no say
    with pytest.warns(scratch.LoadingWarning):
        second = scratch.BertForSequenceClassification.from_pretrained(folder)
    assert first.loading_report.initialized == ("classifier.weight", "classifier.bias")
    assert torch.equal(first.classifier.weight, second.classifier.weight)
    assert first.classifier.weight.std() > 0
    assert (
        "embeddings.word_embeddings.weight",
        "bert.embeddings.word_embeddings.weight",
    ) in first.loading_report.renamed


def test_head_checkpoint_into_the_base_model_reports_unused_keys(tmp_path: Path) -> None:
    folder = saved(tmp_path, "BertForPreTraining")
    with pytest.warns(scratch.LoadingWarning, match=r"were not used: cls\.predictions\.bias"):
        model = scratch.BertModel.from_pretrained(folder)
    assert "cls.seq_relationship.weight" in model.loading_report.unused
    hf = hf_model("BertForPreTraining", **SMALL).bert
    with torch.no_grad():
        assert_equal_outputs(hf(**small_inputs()), model(**small_inputs()))


def test_pooler_of_a_base_checkpoint_is_unused_by_a_head_without_one(tmp_path: Path) -> None:
    with pytest.warns(scratch.LoadingWarning) as record:
        model = scratch.BertForTokenClassification.from_pretrained(saved(tmp_path))
    assert any("were not used: pooler.dense" in str(w.message) for w in record)
    assert "pooler.dense.weight" in model.loading_report.unused


@pytest.mark.parametrize(
    ("head", "into", "match"),
    [
        ("BertModel", "BertForMaskedLM", r"missing head parameters cls\.predictions\.bias"),
        ("BertForMaskedLM", "BertModel", r"unused checkpoint keys cls\.predictions\.bias"),
    ],
)
def test_strict_loading_refuses_missing_or_unused_head_keys(
    tmp_path: Path, head: str, into: str, match: str
) -> None:
    folder = saved(tmp_path, head)
    with pytest.raises(ModelSourceError, match=match):
        getattr(scratch, into).from_pretrained(folder, strict=True)


def test_the_mlm_decoder_is_tied_to_the_word_embeddings(tmp_path: Path) -> None:
    hf = hf_model("BertForMaskedLM", **SMALL)
    model = scratch.BertForMaskedLM.from_hf(hf, strict=True)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    # HF's in-memory state dict names the tied weights twice: both names are accounted for.
    assert set(model.loading_report.tied) == {
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
    }


def test_untied_decoder_loads_its_own_weight(tmp_path: Path) -> None:
    folder = saved(tmp_path, "BertForMaskedLM", tie_word_embeddings=False)
    model = scratch.BertForMaskedLM.from_pretrained(folder, strict=True)
    assert model.cls.predictions.decoder.weight is not model.bert.embeddings.word_embeddings.weight
    assert "cls.predictions.decoder.weight" in model.loading_report.loaded


def test_old_gamma_beta_names_without_prefix_load(tmp_path: Path) -> None:
    folder = saved(tmp_path, "BertForMaskedLM")

    def rename(state: dict[str, torch.Tensor]) -> None:
        for key in [k for k in state if "LayerNorm" in k]:
            new = key.removeprefix("bert.").replace(".weight", ".gamma").replace(".bias", ".beta")
            state[new] = state.pop(key)

    rewrite_weights(folder, rename)
    model = scratch.BertForMaskedLM.from_pretrained(folder, strict=True)
    assert (
        "embeddings.LayerNorm.gamma",
        "bert.embeddings.LayerNorm.weight",
    ) in model.loading_report.renamed
    hf = hf_model("BertForMaskedLM", **SMALL)
    with torch.no_grad():
        assert_equal_outputs(hf(**small_inputs()), model(**small_inputs()))


def test_pytorch_bin_is_read_when_there_is_no_safetensors(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    model = scratch.BertModel.from_pretrained(folder, strict=True)
    assert model.loading_report.source.endswith("pytorch_model.bin")


def test_safetensors_win_over_pytorch_bin(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    state = load_file(folder / "model.safetensors")
    torch.save({k: torch.zeros_like(v) for k, v in state.items()}, folder / "pytorch_model.bin")
    model = scratch.BertModel.from_pretrained(folder)
    assert torch.equal(
        model.embeddings.word_embeddings.weight, state["embeddings.word_embeddings.weight"]
    )


def test_a_pickle_that_is_not_only_weights_is_refused(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save(
        {"embeddings.word_embeddings.weight": torch.zeros(2), "code": Path("x")},
        folder / "pytorch_model.bin",
    )
    with pytest.raises(ModelSourceError, match=r"cannot read weights from .*pytorch_model\.bin"):
        scratch.BertModel.from_pretrained(folder)


def test_sharded_safetensors_load(tmp_path: Path) -> None:
    hf = hf_model("BertModel", **SMALL)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = scratch.BertModel.from_pretrained(tmp_path, strict=True)
    with torch.no_grad():
        assert_equal_outputs(hf(**small_inputs()), model(**small_inputs()))


# -- errors, one by one ------------------------------------------------------------------------


def test_a_missing_backbone_key_is_an_error_naming_key_and_shape(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    rewrite_weights(folder, lambda s: s.pop("encoder.layer.1.output.dense.weight"))
    with pytest.raises(
        ModelSourceError, match=re.escape("encoder.layer.1.output.dense.weight (32, 64)")
    ):
        scratch.BertModel.from_pretrained(folder)


def test_an_unexpected_key_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    rewrite_weights(
        folder, lambda s: s.update({"encoder.layer.2.output.dense.weight": torch.zeros(32, 64)})
    )
    with pytest.raises(
        ModelSourceError, match=r"fit no parameter of BertModel: encoder\.layer\.2\.output"
    ):
        scratch.BertModel.from_pretrained(folder)


def test_a_shape_mismatch_names_the_key_and_both_shapes(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    rewrite_weights(folder, lambda s: s.update({"pooler.dense.weight": torch.zeros(32, 16)}))
    with pytest.raises(
        ModelSourceError,
        match=r"'pooler\.dense\.weight' has shape \(32, 16\).*has shape \(32, 32\)",
    ):
        scratch.BertModel.from_pretrained(folder)


def test_a_classifier_with_other_num_labels_is_a_shape_error(tmp_path: Path) -> None:
    folder = saved(tmp_path, "BertForSequenceClassification", num_labels=3)
    with pytest.raises(
        ModelSourceError,
        match=r"'classifier\.(weight|bias)' has shape \(3,( 32)?\).*has shape \(5,( 32)?\)",
    ):
        scratch.BertForSequenceClassification.from_pretrained(folder, num_labels=5)


def test_two_keys_for_one_parameter_is_an_error(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    rewrite_weights(
        folder,
        lambda s: s.update(
            {"embeddings.LayerNorm.gamma": s["embeddings.LayerNorm.weight"].clone()}
        ),
    )
    with pytest.raises(
        ModelSourceError, match=r"both load into BertModel\.embeddings\.LayerNorm\.weight"
    ):
        scratch.BertModel.from_pretrained(folder)


def test_a_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"checkpoint folder .*nowhere' does not exist"):
        scratch.BertModel.from_pretrained(tmp_path / "nowhere")


def test_a_file_instead_of_a_folder_is_an_error(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    with pytest.raises(ModelSourceError, match=r"is a file; pass the folder"):
        scratch.BertModel.from_pretrained(folder / "config.json")


def test_a_folder_without_config_is_an_error(tmp_path: Path) -> None:
    (saved(tmp_path) / "config.json").unlink()
    with pytest.raises(ModelSourceError, match=r"no config\.json at"):
        scratch.BertModel.from_pretrained(tmp_path)


def test_a_folder_without_weights_is_an_error(tmp_path: Path) -> None:
    (saved(tmp_path) / "model.safetensors").unlink()
    with pytest.raises(ModelSourceError, match=r"no weights in .*looked for model\.safetensors"):
        scratch.BertModel.from_pretrained(tmp_path)


def test_a_corrupt_safetensors_file_is_an_error(tmp_path: Path) -> None:
    (saved(tmp_path) / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelSourceError, match=r"cannot read weights from .*model\.safetensors"):
        scratch.BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "roberta"}, r"model_type 'roberta'"),
        ({"is_decoder": True}, r"is_decoder=True"),
        ({"position_embedding_type": "relative_key"}, r"position_embedding_type='relative_key'"),
        ({"num_attention_heads": 5}, r"hidden size \(32\) is not a multiple .* heads \(5\)"),
        ({"hidden_act": "mish"}, r"hidden_act 'mish' is not supported"),
        ({"problem_type": "ranking"}, r"problem_type 'ranking'"),
    ],
)
def test_a_config_this_bert_cannot_be_is_an_error(tmp_path: Path, change: dict, match: str) -> None:
    folder = saved(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelSourceError, match=match):
        scratch.BertModel.from_pretrained(folder)


def test_config_that_is_not_json_is_an_error(tmp_path: Path) -> None:
    (saved(tmp_path) / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match=r"cannot read .*config\.json' as JSON"):
        scratch.BertModel.from_pretrained(tmp_path)


def test_unknown_config_override_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"BertConfig has no field 'num_label'"):
        scratch.BertModel.from_pretrained(saved(tmp_path), num_label=3)


def test_unknown_attention_implementation_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"attn_implementation 'flash' is not supported"):
        scratch.BertModel.from_pretrained(saved(tmp_path), attn_implementation="flash")


def test_from_hf_refuses_what_is_not_a_hf_model() -> None:
    with pytest.raises(
        ModelSourceError, match=r"from_hf takes a transformers BERT model.*got Linear"
    ):
        scratch.BertModel.from_hf(torch.nn.Linear(2, 2))


def test_loading_errors_are_introspect_errors() -> None:
    assert issubclass(ModelSourceError, IntrospectError)


# -- options -----------------------------------------------------------------------------------


def test_attention_implementation_comes_from_the_argument_the_config_or_sdpa(
    tmp_path: Path,
) -> None:
    folder = saved(tmp_path)
    assert scratch.BertModel.from_pretrained(folder).config.attn_implementation == "sdpa"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_attn_implementation": "eager"}))
    model = scratch.BertModel.from_pretrained(folder)
    assert model.encoder.layer[1].attention.self.attn_implementation == "eager"
    model = scratch.BertModel.from_pretrained(folder, attn_implementation="sdpa")
    assert model.encoder.layer[1].attention.self.attn_implementation == "sdpa"


def test_from_hf_follows_the_hf_models_attention_and_dtype() -> None:
    hf = hf_model("BertModel", attn="eager", **SMALL).to(torch.float64)
    model = scratch.BertModel.from_hf(hf)
    assert model.config.attn_implementation == "eager"
    assert model.embeddings.word_embeddings.weight.dtype == torch.float64


def test_dtype_argument(tmp_path: Path) -> None:
    model = scratch.BertModel.from_pretrained(saved(tmp_path), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(**small_inputs()).last_hidden_state.dtype == torch.bfloat16


def test_auto_model_class_reads_the_architecture(tmp_path: Path) -> None:
    assert (
        scratch.auto_model_class(saved(tmp_path / "a", "BertForQuestionAnswering"))
        is scratch.BertForQuestionAnswering
    )
    folder = saved(tmp_path / "b")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertLMHeadModel"]})
    )
    with pytest.raises(ModelSourceError, match=r"architecture 'BertLMHeadModel'"):
        scratch.auto_model_class(folder)


# -- writing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_save_pretrained_round_trips_through_hf(tmp_path: Path, head: str) -> None:
    import transformers

    model = quiet_from_hf(getattr(scratch, head), hf_model(head, seed=5, num_labels=3, **SMALL))
    model.save_pretrained(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = getattr(transformers, head).from_pretrained(tmp_path).eval()
    again = getattr(scratch, head).from_pretrained(tmp_path, strict=True)
    with torch.no_grad():
        assert_equal_outputs(hf(**small_inputs()), model(**small_inputs()))
        assert_equal_outputs(model(**small_inputs()), again(**small_inputs()))


# -- hostile checkpoints: refused before anything large is read or built -----------------------


def test_a_shard_index_pointing_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    hf_model("BertModel", **SMALL).save_pretrained(folder, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../stolen.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelSourceError, match=r"names the shard '\.\./stolen\.safetensors'"):
        scratch.BertModel.from_pretrained(folder)


def test_a_shard_linked_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    hf_model("BertModel", **SMALL).save_pretrained(folder, max_shard_size="20KB")
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(ModelSourceError, match="outside the checkpoint folder"):
        scratch.BertModel.from_pretrained(folder)


def test_a_config_override_too_large_for_memory_is_refused_before_building(
    tmp_path: Path,
) -> None:
    with pytest.raises(ModelSourceError, match=r"describes a model of about .* parameters"):
        scratch.BertModel.from_pretrained(saved(tmp_path), vocab_size=10**12)


def test_more_layers_in_the_config_than_in_the_weights_is_refused_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100000 layers estimate ~3 GiB: on a busy machine the memory guard, which comes first,
    # would answer instead; with memory to spare the weights' own sizes must.
    from introspect.models import validate

    monkeypatch.setattr(validate, "available_memory", lambda: 1 << 40)
    folder = saved(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 100000}))
    with pytest.raises(ModelSourceError, match=r"num_hidden_layers 100000, but .* holds 2"):
        scratch.BertModel.from_pretrained(folder)


@pytest.mark.parametrize(("change", "match"), [
    ({"hidden_size": "32"}, r"hidden_size is '32'; it must be a whole number > 0"),
    ({"num_attention_heads": 0}, r"num_attention_heads is 0"),
    ({"layer_norm_eps": -1}, r"layer_norm_eps is -1; it must be a number > 0"),
    ({"num_labels": 1e9}, r"num_labels is 1000000000.0"),
    ({"hidden_dropout_prob": 2}, r"hidden_dropout_prob is 2"),
    ({"pad_token_id": -1}, r"pad_token_id is -1"),
])
def test_config_values_of_the_wrong_type_or_range_are_refused(tmp_path: Path, change: dict,
                                                              match: str) -> None:
    folder = saved(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelSourceError, match=match):
        scratch.BertModel.from_pretrained(folder)
    with pytest.raises(ModelSourceError, match=match.split(";")[0]):
        scratch.BertConfig.from_dict({**config, **change})


def test_the_errors_are_input_errors_of_one_line(tmp_path: Path) -> None:
    from introspect.errors import InputError

    folder = saved(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as caught:
        scratch.BertModel.from_pretrained(folder)
    assert "\n" not in str(caught.value) and "the file is empty" in str(caught.value)


@pytest.mark.parametrize("name", sorted(scratch.MODELS))
def test_a_loaded_model_is_the_model_built_on_the_cpu_then_loaded(name: str) -> None:
    # Loading builds on the meta device (no weight drawn that the checkpoint replaces):
    # every parameter and buffer must be what building on the CPU, then loading, gives,
    # the head weights the base checkpoint lacks drawn from the same seed, ties kept.
    from introspect.models.load import minilm_folder
    from introspect.scratch import loading

    cls = scratch.MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scratch.LoadingWarning)
        loaded = cls.from_pretrained(minilm_folder())
        config, state, source = loading.read_checkpoint(minilm_folder())
        expected = cls(config)
        loading.load_state(expected, state, source)
    got, want = loaded.state_dict(keep_vars=True), expected.eval().state_dict(keep_vars=True)
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    assert loaded.loading_report == expected_report(expected, state, source)
    # Parameters shared as on the CPU (the decoder's weight and bias, in an MLM head).
    assert loading.tied_aliases(loaded) == loading.tied_aliases(expected)
    assert bool(loading.tied_aliases(loaded)) == ("MaskedLM" in name or "PreTraining" in name)


def expected_report(model: Any, state: Any, source: str) -> Any:
    from introspect.scratch import loading

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scratch.LoadingWarning)
        return loading.load_state(model, state, source)
