"""Shell completion: the documented line sets it up in bash, and Tab answers from the parser
(commands, options, choices) without importing torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _complete(line: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[str]:
    """What Tab offers after ``line``, asked as the shell code asks (argcomplete's protocol)."""
    out = tmp_path / "completions"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from introspect.cli.main import main; "
         "sys.exit(main())"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "_ARGCOMPLETE": "1", "COMP_LINE": line,
             "COMP_POINT": str(len(line)), "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
             "_ARGCOMPLETE_IFS": "\n", **(env or {})},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out.read_text().split()


def test_tab_completes_commands_options_and_choices(tmp_path):
    assert {"trace", "draw", "diff", "attention", "capture", "examples", "completion"} <= \
        set(_complete("introspect ", tmp_path))
    assert set(_complete("introspect diff --cand", tmp_path)) >= {"--candidate",
                                                                  "--candidate-dump"}
    offered = _complete("introspect completion ", tmp_path)
    assert [w for w in offered if not w.startswith("-")] == ["bash", "zsh", "fish"]
    assert _complete("introspect trace --format g", tmp_path) == ["graphml"]


def test_completing_never_imports_torch(tmp_path):
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers'):\n"
        "            raise ImportError('torch imported while completing')\n"
        "sys.meta_path.insert(0, _NoTorch())\n")
    words = _complete("introspect diff --", tmp_path,
                      env={"PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert {"--candidate", "--backward", "--generate"} <= set(words)


def test_the_script_is_argcompletes_for_each_shell():
    for shell, marker in (("bash", "complete "), ("zsh", "#compdef introspect"),
                          ("fish", "complete --command introspect")):
        done = subprocess.run([sys.executable, "-m", "introspect", "completion", shell],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0 and marker in done.stdout, (shell, done.stdout[:300])
    bad = subprocess.run([sys.executable, "-m", "introspect", "completion", "tcsh"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash")
def test_bash_completes_commands_and_options(tmp_path):
    """The documented line, in bash: it registers a completion for introspect."""
    launcher = tmp_path / "bin" / "introspect"
    launcher.parent.mkdir()
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -m introspect \"$@\"\n")
    launcher.chmod(0o755)
    done = subprocess.run(["bash", "-c", 'eval "$(introspect completion bash)" && '
                           "complete -p introspect"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT),
                                           "PATH": f"{launcher.parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(" introspect"), done.stdout
    assert "_python_argcomplete" in done.stdout
