"""Cheap inputs are checked before any model loads: one line, exit 2, no waiting."""

from __future__ import annotations

import json

import pytest

from introspect.cli.main import main
from introspect.errors import InputError
from introspect.models.validate import check_texts


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: every refusal must come before it."""
    import introspect.models.load

    def refuse(*args, **kwargs):
        pytest.fail("a model was loaded before the input was checked")

    monkeypatch.setattr(introspect.models.load, "load_model", refuse)


@pytest.mark.parametrize("argv, message", [
    (["trace", "--text", "   "], "text 1 is empty"),
    (["trace", "--text", "fine", "--text", "bad \udcff bytes"], "text 2 is not valid UTF-8"),
    (["trace", "--head", "next-sentence", "--text", "one"], "takes texts in pairs"),
    (["draw", "--expand", "7", "-o", "{tmp}/x.svg"], "cannot expand layer 7: the model has 2"),
    (["draw", "--expand", "-3", "-o", "{tmp}/x.dot"], "cannot expand layer -3"),
    (["diff", "--atol", "nan"], "--atol must be a finite number"),
    (["diff", "--candidate-model", "{tmp}/broken"], "hidden_act 'nope' is not supported"),
    (["diff", "--candidate-model", "{tmp}/nowhere"], "nowhere' does not exist"),
    (["diff", "--candidate-model", "someone/not-cached"], "not in the local Hugging Face cache"),
])
def test_bad_inputs_are_refused_before_loading(tmp_path, capsys, no_loading, argv, message):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps(
        {"model_type": "bert", "hidden_act": "nope"}))
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
    argv = [a.format(tmp=tmp_path) for a in argv]
    model = [] if "--model" in argv else ["--model", "bert-tiny"]
    assert main([*argv[:1], *model, *argv[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_check_texts_in_the_python_api():
    assert check_texts(["a", "b"]) == ("a", "b")
    assert check_texts("one text") == ("one text",)
    for texts, message in (([], "no text given"), ([3], "text 1 is a int"),
                           (["ok", "\ud800"], "text 2 is not valid UTF-8")):
        with pytest.raises(InputError, match=message):
            check_texts(texts)
