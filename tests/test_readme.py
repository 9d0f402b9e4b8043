"""The README tells the truth: its commands exist, CI runs its test command, its CLI
reference is the commands' own --help."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_two_commands_are_make_targets_and_ci_runs_the_test_command():
    readme = (ROOT / "README.md").read_text()
    two = re.search(r"## Two commands\n\n```sh\n(.*?)```", readme, re.S)
    assert two is not None
    commands = [line.split("#")[0].strip() for line in two.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}: setup$", makefile, re.M), target
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_set_up_pins_torch_before_the_package():
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.index("torch==2.13.0") < makefile.index("-e '.[test,dev]'")


def test_files_the_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\(((?:reports|examples)/[^)]+)\)", readme):
        assert (ROOT / link).exists(), link
