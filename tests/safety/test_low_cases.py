"""The low cases of the audit: no command, a text of control characters, a killed swap.

(The kill -9 during a report swap is in test_out_lock.py: the next run repairs it.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from introspect.cli.main import main

ROOT = Path(__file__).parents[2]


def test_introspect_without_a_command_prints_usage_on_stderr_and_exits_2():
    run = subprocess.run([sys.executable, "-m", "introspect"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert lines[0].startswith("usage: introspect")
    assert lines[-1] == ("introspect: error: give a command (trace, draw, diff, attention, "
                         "capture, examples, completion); see 'introspect --help'")
    assert "Traceback" not in run.stderr


def test_draw_of_a_text_of_control_characters_draws_as_any_text(tmp_path, capsys):
    outputs = {}
    for name, text in (("plain", "hello"), ("control", "\x01\x02\x1b\x07\x7f")):
        code = main(["draw", "--model", "bert-tiny", "--text", text, "-o",
                     str(tmp_path / f"{name}.svg")])
        err = capsys.readouterr().err
        assert code == 0, err
        outputs[name] = err.replace(f"{name}.svg", "NAME.svg").splitlines()
    assert outputs["control"] == outputs["plain"]  # no Graphviz lines, nothing more
    assert "<svg" in (tmp_path / "control.svg").read_text()
