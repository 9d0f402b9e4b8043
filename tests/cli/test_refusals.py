"""Every refusal the CLI can give cheaply is one line under 200 characters, exit 2.

A refusal is read in a terminal and in a CI log's last lines: a backend's 1,250-character
error (``--device mps`` on a machine without it), a usage error that became an "internal
error" (``--nproc ²``: ``str.isdigit`` is true for ``'²'``, ``int('²')`` raises), or a
number in other digits that ``int`` reads anyway (``--atol ١`` is 1.0) each failed that.
"""

from __future__ import annotations

import pytest

from tests.refusals import cli_refusal

DIFF = ["diff", "--model", "bert-tiny", "--candidate", "hf", "-q"]
LONG = "x" * 500

REFUSALS = {
    # devices
    "device mps": [*DIFF, "--device", "mps"],
    "device xla": [*DIFF, "--device", "xla"],
    "device unknown": [*DIFF, "--device", "tpu9"],
    "device long": [*DIFF, "--device", LONG],
    "device cuda:9": [*DIFF, "--device", "cuda:9"],
    "device meta": [*DIFF, "--device", "meta"],
    "candidate device mps": [*DIFF, "--candidate-device", "mps"],
    # numbers
    "nproc superscript": [*DIFF, "--nproc", "²"],
    "nproc arabic-indic": [*DIFF, "--nproc", "١"],
    "nproc word": [*DIFF, "--nproc", "two"],
    "nproc-timeout superscript": [*DIFF, "--nproc-timeout", "²"],
    "atol arabic-indic": [*DIFF, "--atol", "١"],
    "atol superscript": [*DIFF, "--atol", "²"],
    "atol negative": [*DIFF, "--atol", "-1"],
    "atol nan": [*DIFF, "--atol", "nan"],
    "rtol fullwidth": [*DIFF, "--rtol", "１"],
    "generate superscript": [*DIFF, "--generate", "²"],
    "generate huge": [*DIFF, "--generate", "9" * 300],
    "attention layer superscript": ["attention", "--model", "bert-tiny", "--layer", "²"],
    "attention heads arabic-indic": ["attention", "--model", "bert-tiny", "--heads", "١"],
    "attention row arabic-indic": ["attention", "--model", "bert-tiny", "--row", "١"],
    "attention tokens": ["attention", "--model", "bert-tiny", "--tokens", "²:3"],
    "draw depth": ["draw", "--model", "bert-tiny", "--depth", "١"],
    "trace depth": ["trace", "--model", "bert-tiny", "--depth", "²"],
    # missing files
    "model folder": ["trace", "--model", "/nonexistent/" + LONG],
    "candidate port": [*DIFF[:3], "--candidate", "/nonexistent/port.py:build"],
    "candidate port long": [*DIFF[:3], "--candidate", f"/nonexistent/{LONG}.py:build"],
    "reference dump": [*DIFF, "--reference-dump", "/nonexistent/ref.safetensors"],
    "loss file": [*DIFF, "--backward", "--loss", "/nonexistent/loss.py:loss"],
    "candidate dump": [*DIFF[:3], "--candidate-dump", "/nonexistent/cand.safetensors"],
    "choice long": [*DIFF, "--head", LONG],
    "unknown option": ["diff", "--no-such-option"],
    "no command": [],
}


@pytest.mark.parametrize("argv", REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refusal_is_one_short_line(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("INTROSPECT_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # a run that is not refused writes its drawing here
    code, err = cli_refusal(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    last = lines[-1]  # an argparse usage line may come before the refusal ("no command")
    assert len(lines) == 1 or (argv == [] and len(lines) == 2), err
    assert len(last) < 200, f"{len(last)} characters: {last}"


def test_a_long_line_keeps_its_ends():
    from introspect.cli.refusal import one_line

    line = one_line(f"introspect diff: error: port '/data/{LONG}/port.py:build': no such "
                    "file; give path/to/port.py:NAME")
    assert len(line) < 200
    assert line.startswith("introspect diff: error: port '/data/…/port.py:build'")  # its ends
    assert "/port.py:build'" in line and line.endswith("give path/to/port.py:NAME")
