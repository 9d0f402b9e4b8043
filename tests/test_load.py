"""Model sources load offline, and every bad source fails with a clear error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from introspect.errors import InputError, ModelSourceError
from introspect.models.load import DEFAULT_TEXTS, load_model, minilm_folder, tokenize


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


def test_a_loaded_model_can_be_handed_to_a_port_build_as_it_is(minilm):
    """The README passes ``load_model(...)`` straight to ``examples/ci/my_port.py:build``,
    which reads ``.model`` and ``.config`` as a ``LoadedReference`` offers them."""
    from introspect.models.ports import LoadedReference

    assert minilm.config is minilm.model.config
    offered = {f for f in LoadedReference.__dataclass_fields__ if f != "config"}
    assert offered <= set(vars(minilm))  # every other field of the port's contract


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
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ModelSourceError, match="holds a t5 model; supported checkpoints: "
                                               "model_type bert, roberta, distilbert"):
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


# -- no global side effects; hub ids from the local cache only ------------------------------

_SUBPROCESS_ENV = {k: v for k, v in os.environ.items()
                   if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
_SUBPROCESS_ENV["PYTHONPATH"] = str(Path(__file__).parents[1])

# torch sets TORCHINDUCTOR_CACHE_DIR when torch._dynamo is first imported (transformers
# imports it while building a model): torch's own doing, so it is imported before the
# snapshot; everything after it is introspect's.
SIDE_EFFECTS_SCRIPT = """
import os, sys
import torch._dynamo
before = dict(os.environ)
import introspect
from introspect.models.load import load_model, tokenize
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_info()          # a notebook's own choice
hf_logging.enable_progress_bar()
env, level = dict(os.environ), hf_logging.get_verbosity()
loaded = load_model("bert-tiny")
load_model(sys.argv[1])
tokenize(loaded.tokenizer, ["I love cats!"])
assert before == env == dict(os.environ), set(os.environ.items()) ^ set(before.items())
assert hf_logging.get_verbosity() == level, hf_logging.get_verbosity()
assert hf_logging.is_progress_bar_enabled()
print("unchanged")
"""


def _run(script: str, *args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, env=env or _SUBPROCESS_ENV, timeout=300)


def test_importing_and_loading_change_no_environment_and_no_logging_level(tmp_path,
                                                                          tiny_models):
    tiny_models("base").model.save_pretrained(tmp_path)
    run = _run(SIDE_EFFECTS_SCRIPT, str(tmp_path))
    assert run.returncode == 0 and "unchanged" in run.stdout, run.stderr


def _fake_hub_cache(home: Path, repo: str, model: torch.nn.Module) -> None:
    """A local HF cache entry as huggingface_hub lays it out: blobs, a snapshot of links."""
    repo_folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    saved = home / "saved"
    model.save_pretrained(saved)
    snapshot = repo_folder / "snapshots" / revision
    (repo_folder / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in saved.iterdir():
        blob = repo_folder / "blobs" / f"blob-{file.name}"
        shutil.move(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo_folder / "refs").mkdir()
    (repo_folder / "refs" / "main").write_text(revision)


def test_a_hub_id_in_the_local_cache_loads_with_no_network(tmp_path, tiny_models):
    _fake_hub_cache(tmp_path, "someone/tiny-bert", tiny_models("masked-lm").model)
    env = {**_SUBPROCESS_ENV, "HF_HOME": str(tmp_path)}
    env.pop("HF_HUB_CACHE", None)
    script = ("from introspect.models.load import load_model\n"
              "loaded = load_model('someone/tiny-bert', head='masked-lm')\n"
              "print(loaded.folder.parent.parent.name, loaded.model.config.num_hidden_layers)\n")
    run = _run(script, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["models--someone--tiny-bert", "2"]


def test_a_hub_id_not_in_the_cache_is_one_line_saying_offline_only(tmp_path):
    env = {**_SUBPROCESS_ENV, "HF_HOME": str(tmp_path)}
    script = ("import sys\nfrom introspect.cli.main import main\n"
              "sys.exit(main(['trace', '--model', 'someone/not-cached']))\n")
    run = _run(script, env=env)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert ("unknown model 'someone/not-cached'" in run.stderr
            and "not in the local Hugging Face cache" in run.stderr
            and "models are never downloaded" in run.stderr)
    assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.json"))
