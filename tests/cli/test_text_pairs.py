"""`introspect diff`'s inputs exercise the port: sentence pairs with padding by default.

The default is two pairs of different lengths: the batch is padded (the attention mask is
exercised) and token_type_ids holds both segments. ``--text-pair A B`` gives pairs from
the command line; ``--text`` single sentences, and then the diff notes that the
token-type path was never exercised.
"""

from __future__ import annotations

import json

import pytest

from introspect.cli.main import build_parser, main
from introspect.cli.options import DEFAULT_PAIRS, load_model_and_inputs

SEGMENT_NOTE = "every token_type_id is 0: the token-type (segment) path was never exercised"
PADDING_NOTE = "no padding in the batch: the attention mask was never exercised"


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def inputs_of(*argv: str):
    args = build_parser().parse_args(["diff", "--model", "bert-tiny", "-q", *argv])
    return load_model_and_inputs(args)[1]


def notes_of(capsys, *argv: str) -> list[str]:
    assert main(["diff", "--model", "bert-tiny", "-q", "--json", "-", *argv]) == 0
    return json.loads(capsys.readouterr().out)["notes"]


def test_the_default_is_two_padded_pairs_with_both_segments():
    inputs = inputs_of()
    assert inputs.texts == tuple(text for pair in DEFAULT_PAIRS for text in pair)
    ids, types, mask = (inputs.tensors[n] for n in
                        ("input_ids", "token_type_ids", "attention_mask"))
    assert ids.shape == (2, 15)
    assert inputs.tokens[0][:7] == ("[CLS]", "i", "love", "cats", "!", "[SEP]", "he")
    assert inputs.tokens[0][-2:] == ("[PAD]", "[PAD]")  # the shorter pair is padded
    assert mask.sum(dim=1).tolist() == [13, 15]
    assert types.tolist() == [[0] * 6 + [1] * 7 + [0] * 2, [0] * 8 + [1] * 7]


def test_the_default_leaves_no_path_unexercised(capsys):
    notes = notes_of(capsys)
    assert not any(SEGMENT_NOTE in n or PADDING_NOTE in n for n in notes), notes


def test_single_sentences_are_noted_as_leaving_the_token_type_path_untested(capsys):
    notes = notes_of(capsys, "--text", "I love cats!", "--text", "He hates pineapple pizza.")
    assert any(SEGMENT_NOTE in n for n in notes), notes
    assert not any(PADDING_NOTE in n for n in notes)


def test_text_pairs_from_the_command_line():
    inputs = inputs_of("--text-pair", "Cats purr.", "Dogs bark.",
                       "--text-pair", "Birds sing at dawn.", "Fish swim.")
    assert inputs.texts == ("Cats purr.", "Dogs bark.", "Birds sing at dawn.", "Fish swim.")
    assert inputs.tokens[0] == ("[CLS]", "cats", "pu", "##rr", ".", "[SEP]", "dogs", "bark",
                                ".", "[SEP]", "[PAD]")
    assert inputs.tensors["token_type_ids"][1].tolist() == [0] * 7 + [1] * 4


def test_text_pairs_exercise_the_token_type_path_in_the_diff(capsys):
    notes = notes_of(capsys, "--text-pair", "Cats purr.", "Dogs bark.")
    assert not any(SEGMENT_NOTE in n for n in notes), notes
    assert any(PADDING_NOTE in n for n in notes)  # one row: nothing to pad


def test_text_pairs_are_the_choices_of_multiple_choice():
    inputs = inputs_of("--head", "multiple-choice", "--text-pair", "The cat", "sat down.",
                       "--text-pair", "The cat", "flew away at once.")
    assert inputs.tensors["input_ids"].shape == (1, 2, 10)
    assert inputs.tensors["token_type_ids"][0, 1].tolist() == [0] * 4 + [1] * 6


def test_a_port_that_ignores_token_types_fails_on_the_default(tmp_path, capsys):
    """What the default is for: a port without the segment embedding no longer passes."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "ci" / "my_port.py"
    port = tmp_path / "no_segments.py"
    port.write_text(
        "import importlib.util, torch\n"
        f"spec = importlib.util.spec_from_file_location('_no_seg', {str(example)!r})\n"
        "my_port = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(my_port)\n"
        "def build(reference):\n"
        "    model = my_port.build(reference)\n"
        "    with torch.no_grad():\n"
        "        model.embed.seg.weight[1] = model.embed.seg.weight[0]  # segment B as A\n"
        "    return model\n")
    spec = f"{port}:build"
    assert main(["diff", "--model", "bert-tiny", "-q", "--candidate", spec,
                 "--text", "I love cats!"]) == 0  # one segment: the bug cannot show
    assert main(["diff", "--model", "bert-tiny", "-q", "--candidate", spec]) == 1
    assert "parity FAILS" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--text", "a", "--text-pair", "b", "c"],
     "--text and --text-pair do not mix in one batch: give every row as --text-pair A B, "
     "or use only --text"),
    (["--text-pair", "a", ""], "pair 1's second text is empty; give every --text-pair some "
                               "words"),
    (["--text-pair", "a b", "c", "--text-pair", " ", "d"],
     "pair 2's first text is empty; give every --text-pair some words"),
    (["--text-pair", "a\udcff", "b"], "pair 1's first text is not valid UTF-8 (byte 0xff"),
    (["--text-pair", "only one"], "argument --text-pair: expected 2 arguments"),
    (["--text-pair", "a", "b", "--reference-dump", "capture.safetensors"],
     "--text-pair goes with a live reference; a capture holds its own inputs"),
])
def test_bad_text_pairs_are_one_line_and_exit_2(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if "--reference-dump" in argv:  # a real capture, so that only the texts are wrong
        assert main(["capture", "--model", "bert-tiny", "-q", "-o", argv[-1]]) == 0
    try:
        code = main(["diff", "--model", "bert-tiny", "-q", *argv])
    except SystemExit as e:  # argparse's own errors end in parse_args
        code = e.code
    assert code == 2
    assert message in only_line(capsys.readouterr().err)
