"""`introspect draw` end to end: formats, files, and one line + exit 2 on bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from introspect.cli.main import main

VENV_CLI = Path(sys.executable).with_name("introspect")


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_svg_file_with_tokens_and_shapes(tmp_path, capsys):
    out = tmp_path / "tiny.svg"
    assert (
        main(
            [
                "draw",
                "--model",
                "bert-tiny",
                "--head",
                "sequence-classification",
                "--depth",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert f"wrote {out}" in capsys.readouterr().err
    text = " ".join(ElementTree.parse(out).getroot().itertext())
    assert "[CLS]" in text and "(2, 8, 128)" in text and "encoder.layer.0–1 ×2" in text


def test_dot_to_stdout_and_same_bytes_twice(capsysbinary):
    argv = [
        "draw",
        "--model",
        "bert-tiny",
        "--expand",
        "0,-1",
        "--text",
        "I love cats!",
        "-q",
        "-o",
        "-",
        "--format",
        "dot",
    ]
    assert main(argv) == 0
    first = capsysbinary.readouterr().out
    assert main(argv) == 0
    assert first.startswith(b"digraph introspect {") and first == capsysbinary.readouterr().out
    assert "×".encode() not in first  # both layers expanded: nothing folded


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--depth", "-1"], "depth must be >= 0, not -1"),
        (["--depth", "deep"], "depth must be a number >= 0 or 'full', not 'deep'"),
        (["--expand", "a,b"], "--expand takes layer numbers"),
        (["-o", "{tmp}/out.jpg"], "cannot tell the drawing format from"),
        (["-o", "{tmp}/missing/out.svg"], "folder"),
        (["--format", "gif", "-o", "{tmp}/out.svg"], "invalid choice: 'gif'"),
        (["--expand", "7", "-o", "{tmp}/out.svg"], "cannot expand layer 7: the model has 2"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert exit_code(["draw", "--model", "bert-tiny", "-q", *argv]) == 2
    assert message in only_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


def test_existing_file_is_kept_when_drawing_fails(tmp_path, capsys):
    out = tmp_path / "keep.svg"
    out.write_text("old")
    assert exit_code(["draw", "--model", "bert-tiny", "-q", "--expand", "9", "-o", str(out)]) == 2
    assert out.read_text() == "old" and sorted(tmp_path.iterdir()) == [out]


def test_missing_graphviz_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # a PATH with no 'dot' on it
    result = subprocess.run(
        [sys.executable, "-m", "introspect", "draw", "-o", str(tmp_path / "out.svg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Graphviz's 'dot' program was not found" in only_line(result.stderr)
    assert not (tmp_path / "out.svg").exists()


def test_real_cli_writes_png(tmp_path):
    out = tmp_path / "tiny.png"
    result = subprocess.run(
        [str(VENV_CLI), "draw", "--model", "bert-tiny", "--depth", "2", "-q", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(b"\x89PNG") and result.stderr == ""


def exit_code(argv: list[str]) -> int:
    """main's return value, or argparse's exit code for usage errors."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)
