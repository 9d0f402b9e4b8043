"""Where `introspect` writes: '-' is stdout for every output option, paths are checked
together and before any model loads, and the README's CI line works in an empty folder."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from introspect.cli.main import main
from tests import launch

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def paragraphs(text: str) -> list[str]:
    """Wrapped prose joined again: a line indented 4 more than its paragraph's first continues
    it (the terminal view wraps at the width, with a hanging indent)."""
    joined: list[tuple[int, str]] = []
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if joined and indent >= joined[-1][0] + 4:
            joined[-1] = (joined[-1][0], f"{joined[-1][1]} {line.strip()}")
        else:
            joined.append((indent, line))
    return [line for _, line in joined]


def only_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def introspect_cli(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return launch.run([sys.executable, "-m", "introspect", *argv], cwd=cwd, env=ENV,
                      capture_output=True, timeout=600)


def test_json_on_stdout_is_only_json_and_the_verdict_goes_to_stderr():
    done = introspect_cli(["diff", "--model", "bert-tiny", "--candidate", "hf",
                           "--candidate-dtype", "bfloat16", "--json", "-"])
    assert done.returncode == 1
    document = json.loads(done.stdout)  # what `| jq .first_divergence` reads
    assert document["first_divergence"]["layer"] == "embeddings"
    err = done.stderr.decode()
    assert "parity FAILS" in err and "first divergence: add -> add (add in embeddings)" in err


def test_junit_on_stdout(capsys):
    assert main(["diff", "--model", "bert-tiny", "--junit", "-", "-q"]) == 0
    captured = capsys.readouterr()
    assert ET.fromstring(captured.out).get("failures") == "0"
    assert "parity holds" in captured.err


@pytest.mark.parametrize("fmt", ["json", "csv", "graphml"])
def test_trace_to_stdout_with_dash(fmt, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "--model", "bert-tiny", "--format", fmt, "-o", "-", "-q"]) == 0
    out = capsys.readouterr().out
    if fmt == "json":
        assert json.loads(out)["schema_version"] == 1
    else:
        assert out.startswith("index,name," if fmt == "csv" else "<?xml")
    assert list(tmp_path.iterdir()) == []  # no file named '-'


@pytest.mark.parametrize("argv, message", [
    (["--json", "{tmp}/r.xml", "--junit", "{tmp}/r.xml"],
     "--json and --junit name the same file"),
    (["--json", "-", "--junit", "-"], "--json and --junit both go to stdout"),
    (["--out", "{tmp}/rep", "--json", "{tmp}/rep/junit.xml"],
     "--json and the --junit report in --out"),
    (["--out", "-"], "--out takes a folder"),
    (["--text", "caf\udce9"], "text 1 is not valid UTF-8 (byte 0xe9 at position 3)"),
    (["--text", "ok", "--text", " "], "text 2 is empty"),
    (["--expand", "x"], "unrecognized arguments"),
])
def test_cheap_inputs_are_refused_before_any_model_loads(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = main(["diff", "--model", "bert-tiny", *argv])  # not -q: a load would say so
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == 2
    assert message in only_line(capsys.readouterr().err)  # one line: no "random weights"
    assert list(tmp_path.iterdir()) == []


def test_invalid_utf8_through_the_real_cli_is_one_line():
    done = subprocess.run([sys.executable, "-m", "introspect", "trace", "--model", "bert-tiny",
                           "--text", b"caf\xe9"], env=ENV, capture_output=True, timeout=300)
    assert done.returncode == 2 and done.stdout == b""
    assert "text 1 is not valid UTF-8" in only_line(done.stderr.decode())


def test_quiet_failure_prints_the_verdict_the_first_divergence_and_its_hint(capsys):
    argv = ["diff", "--model", "bert-tiny", "--candidate", "hf", "--candidate-dtype",
            "bfloat16", "--quiet"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    lines = paragraphs(captured.out)
    assert "parity FAILS in the forward" in lines[0]
    assert lines[1].startswith("  hint: the candidate computes in bfloat16")
    assert lines[2].startswith("first divergence: add -> add (add in embeddings)")  # the last
    assert len(lines) == 3 and captured.err == ""  # no table, no notice


def test_quiet_pass_prints_the_verdict_line(capsys):
    """A plain diff (no report asked) that passes rests on the outputs and module evidence:
    its one line says so (``docs/verdict.md``, a PASS with no recording)."""
    assert main(["diff", "--model", "bert-tiny", "--quiet"]) == 0
    line = only_line("\n".join(paragraphs(capsys.readouterr().out)))
    assert "parity holds" in line
    assert line.endswith("module pairs within budget; outputs and module evidence, no "
                         "op-level recording)")


def _readme_ci_line() -> str:
    page = (ROOT / "docs" / "ci.md").read_text()
    block = re.search(r"```sh\n(introspect diff [^\n]*)\n```", page)
    assert block is not None, "docs/ci.md lost its command"
    return block.group(1)


def test_the_readmes_ci_line_runs_green_in_an_empty_folder(tmp_path):
    line = _readme_ci_line()
    assert line == ("introspect diff --model minilm --out parity-report "
                    "--junit parity-report/junit.xml --quiet")
    done = introspect_cli(shlex.split(line)[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert "parity holds" in done.stdout.decode() and done.stderr == b""
    written = {p.name for p in (tmp_path / "parity-report").iterdir()}
    assert {"diff.json", "diff.md", "diff.html", "junit.xml", "nodes.csv", "layers.csv",
            "diff.svg"} <= written
    assert ET.parse(tmp_path / "parity-report" / "junit.xml").getroot().get("failures") == "0"
