"""A refusal stays one line under 200 characters with long inputs, and still names them.

A path of 100 to 160 characters (a deep temporary folder) fits a line alone, but not with
the words of a refusal around it: the CLI shortens the values a line names, a step at a
time (``/tmp/…/folder/port.py:build``, then ``…/port.py:build``), before it cuts words.
The package's own words are short enough that a name fits beside them (the last test).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from introspect.cli.refusal import LINE_LIMIT, one_line
from tests import launch
from tests.refusals import cli_refusal, shows

ROOT = Path(__file__).resolve().parents[2]


def deep(tmp_path: Path, length: int) -> Path:
    """A folder under ``tmp_path`` whose path is ``length`` characters (not created)."""
    folder = tmp_path
    while len(str(folder)) < length - 21:
        folder /= "a_folder_of_some_name"
    return folder / ("x" * (length - len(str(folder)) - 1))


def refusal(argv: list[str], capsys) -> str:
    """The one line the CLI refuses ``argv`` with (exit 2, nothing else on stderr)."""
    code, err = cli_refusal(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert len(lines[0]) < 200, f"{len(lines[0])} characters: {lines[0]}"
    return lines[0]


DIFF = ["diff", "--model", "bert-tiny", "-q"]


@pytest.fixture(params=[100, 130, 160])
def folder(request, tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("INTROSPECT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # a run that is not refused writes nothing elsewhere
    return deep(tmp_path, request.param)


def test_a_port_in_a_folder_that_does_not_exist(folder, capsys):
    spec = f"{folder}/port.py:build"
    line = refusal([*DIFF, "--candidate", spec], capsys)
    assert line.startswith("introspect diff: error: port '") and shows(spec, line)
    assert "no such file" in line


def test_a_broken_port_in_a_deep_folder(folder, capsys):
    folder.mkdir(parents=True)
    (folder / "broken.py").write_text("def build(:\n")
    spec = f"{folder}/broken.py:build"
    line = refusal([*DIFF, "--candidate", spec], capsys)
    assert shows(spec, line) and "failed to import: SyntaxError" in line


def test_a_port_that_raises_a_long_error(folder, capsys):
    folder.mkdir(parents=True)
    (folder / "raises.py").write_text(
        "def build(reference):\n    raise RuntimeError('layer 7 is missing ' * 40)\n")
    spec = f"{folder}/raises.py:build"
    line = refusal([*DIFF, "--candidate", spec], capsys)
    assert shows(spec, line) and "raised RuntimeError: layer 7 is missing" in line


def test_a_model_folder_that_does_not_exist(folder, capsys):
    line = refusal(["trace", "--model", str(folder)], capsys)
    assert shows(str(folder), line) and line.endswith("' does not exist")


def test_a_model_folder_without_a_config(folder, capsys):
    folder.mkdir(parents=True)
    line = refusal(["trace", "--model", str(folder)], capsys)
    assert shows(str(folder), line) and "no config.json" in line


def test_a_candidate_model_folder_that_does_not_exist(folder, capsys):
    line = refusal([*DIFF, "--candidate-model", str(folder)], capsys)
    assert shows(str(folder), line) and "does not exist" in line


def test_a_reference_dump_that_does_not_exist(folder, capsys):
    dump = f"{folder}/reference.safetensors"
    line = refusal([*DIFF, "--reference-dump", dump], capsys)
    assert shows(dump, line)


def test_a_loss_in_a_folder_that_does_not_exist(folder, capsys):
    spec = f"{folder}/loss.py:loss"
    line = refusal([*DIFF, "--backward", "--loss", spec], capsys)
    assert shows(spec, line) and "no such file" in line


def test_an_output_in_a_folder_that_does_not_exist(folder, capsys):
    output = f"{folder}/nodes.csv"
    line = refusal(["trace", "--model", "bert-tiny", "--format", "csv", "-o", output], capsys)
    assert shows(str(folder), line) and "does not exist" in line


def test_a_json_report_under_a_file(folder, capsys):
    folder.parent.mkdir(parents=True)
    folder.write_text("a file, not a folder")
    report = f"{folder}/diff.json"
    line = refusal([*DIFF, "--json", report], capsys)
    assert shows(str(folder), line) or shows(report, line)


OPTIONS = {
    "device mps": (["--device", "mps"], "--device mps: this machine cannot use it"),
    "device xla": (["--device", "xla"], "--device xla: this machine cannot use it"),
    "device cuda:99": (["--device", "cuda:99"], "--device cuda:99: "),
    "device cuda, huge index": (["--device", "cuda:" + "9" * 300], "--device "),
    "device of 300 characters": (["--device", "d" * 300], "not a device torch knows"),
    "candidate device xla": (["--candidate-device", "xla"], "--candidate-device xla: "),
    "head unknown": (["--head", "nope"], "argument --head: invalid choice: 'nope'"),
    "head of 300 characters": (["--head", "h" * 300], "argument --head: invalid choice: 'hhh"),
    "atol a word": (["--atol", "abc"], "--atol must be a number, got 'abc'"),
    "atol negative": (["--atol", "-1"], "--atol must be a finite number >= 0"),
    "atol nan": (["--atol", "nan"], "--atol must be a finite number"),
    "atol too large": (["--atol", "1e999"], "--atol must be a finite number"),
    "atol of 300 digits": (["--atol", "1" * 300 + "x"], "--atol must be a number, got '111"),
    "rtol arabic-indic": (["--rtol", "١"], "--rtol takes a number written in ASCII"),
}


@pytest.mark.parametrize("argv, message", OPTIONS.values(), ids=OPTIONS.keys())
def test_an_odd_option_value(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("INTROSPECT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    line = refusal([*DIFF, *argv], capsys)
    assert message in line


def test_the_real_cli_prints_one_short_line_and_nothing_else(tmp_path):
    """The process itself: no warning, no traceback, one line on stderr, exit 2."""
    folder = deep(tmp_path, 160)
    folder.mkdir(parents=True)
    (folder / "broken.py").write_text("def build(:\n")
    for argv, named in (([*DIFF, "--candidate", f"{folder}/broken.py:build"], "broken.py:build"),
                        ([*DIFF, "--device", "mps"], "--device mps")):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        env.pop("INTROSPECT_DEBUG", None)
        done = launch.run([sys.executable, "-m", "introspect", *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.count("\n") == 1 and len(done.stderr) - 1 < 200, done.stderr
        assert named in done.stderr and "Traceback" not in done.stderr


# --- The shortening itself -----------------------------------------------------------

def _texts(length: int) -> list[str]:
    """Refusals holding a value of about ``length`` characters, or that many words."""
    path = "/tmp/" + "/".join(["folder"] * (length // 7))
    return [
        f"introspect diff: error: port '{path}/port.py:build': no such file; give "
        "path/to/port.py:NAME",
        f"introspect trace: error: checkpoint folder {path} has no config.json, and "
        f"'{'v' * length}' is no model name either; pass a checkpoint folder",
        f"introspect diff: error: cannot write '{path}/a.json': No space left on device "
        f"(ENOSPC); free some space or write elsewhere; any previous file is unchanged (only "
        f"{path}/report/ (8 files) was written)",
        "introspect diff: error: " + " ".join(["word"] * (length // 5)) + " end",
        "introspect diff: error: " + "w" * length + " end",
        f"introspect diff: error: argument --head: invalid choice: '{'h' * length}' (choose "
        "from 'base', 'sequence-classification', 'masked-lm', 'token-classification', "
        "'question-answering', 'multiple-choice', 'next-sentence', 'pretraining', "
        "'causal-lm') (see 'introspect diff --help')",
    ]


@pytest.mark.parametrize("length", range(0, 700, 11))
def test_every_line_fits_and_keeps_its_first_and_last_words(length):
    for text in _texts(length):
        line, whole = one_line(text), " ".join(text.split())
        assert len(line) <= LINE_LIMIT and "\n" not in line, line
        assert line == whole if len(whole) <= LINE_LIMIT else len(line) < len(whole)
        assert line.split()[:3] == whole.split()[:3] and line.split()[-1] == whole.split()[-1]


@pytest.mark.parametrize("length", range(0, 700, 11))
def test_a_path_keeps_its_file_and_a_value_its_ends(length):
    port, folder, full, _, _, choice = (one_line(t) for t in _texts(length))
    assert "/port.py:build': no such file; give path/to/port.py:NAME" in port
    assert "has no config.json" in folder and "pass a checkpoint folder" in folder
    assert "/a.json': No space left on device (ENOSPC)" in full and "(8 files)" in full
    assert f"'{'h' * min(length, 8)}" in choice and "(see 'introspect diff --help')" in choice


def test_the_steps_from_a_folder_to_the_file_alone():
    path = "/tmp/" + "d" * 60 + "/checkpoint/model.safetensors"
    words = "introspect trace: error: cannot read weights from '{}': the file is empty; "
    line = one_line(words.format(path) + "x " * 30)  # the path's folder and file fit
    assert "'/tmp/…/checkpoint/model.safetensors'" in line
    line = one_line(words.format(path) + "x " * 50)  # only the file fits
    assert "'/tmp/…/model.safetensors'" in line or "'…/model.safetensors'" in line


def test_a_short_line_is_left_as_it_is():
    assert one_line("introspect trace: error: text 1 is\nempty") == \
        "introspect trace: error: text 1 is empty"
    line = "introspect diff: error: port '/a/b/c/port.py:build': no such file"
    assert one_line(line) == line


# --- The package's own words leave room for a name -----------------------------------

ERRORS = {"InputError", "ModelSourceError", "TraceError", "IntrospectError", "ReproError",
          "ReferenceChanged", "NoOutputPairs", "NothingToReproduce", "PortStopped",
          "PngConverterMissingError", "GraphvizMissingError"}
WORDS = 150  # characters of a refusal's own words: with the CLI's prefix, 25 are left


def _own_words(node: ast.expr) -> int | None:
    """Characters of a message's literal text (its values not counted), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value)
    if isinstance(node, ast.JoinedStr):
        return sum(len(v.value) for v in node.values if isinstance(v, ast.Constant))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_own_words(node.left) or 0) + (_own_words(node.right) or 0)
    return None


def test_no_refusal_of_the_package_has_more_than_150_characters_of_its_own():
    long = []
    for path in sorted((ROOT / "introspect").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ERRORS and node.args:
                words = _own_words(node.args[0])
                if words is not None and words > WORDS:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} ({words})")
    assert not long, "refusals too long to leave room for a name: " + ", ".join(long)
