"""Every `introspect` command line of every CI recipe in examples/ci/ runs green in a fresh,
empty workspace (with the example port where the recipe checks one), as a CI job would."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests import launch

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
RECIPES = sorted(p.name for p in CI.glob("*.y*ml"))


def command_lines(text: str) -> list[str]:
    """The `introspect ...` commands of a recipe, continuation lines joined, comments left out."""
    commands, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#") or "introspect diff" not in stripped:
            continue
        command = stripped[stripped.index("introspect diff"):]
        while command.endswith("\\"):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        commands.append(command.split(" #")[0].strip())
    return commands


def test_every_recipe_has_commands():
    assert {"github-actions.yml", "github-actions-port.yml", "gitlab-ci.yml",
            "pre-commit-hooks.yaml"} <= set(RECIPES)
    for recipe in RECIPES:
        assert command_lines((CI / recipe).read_text()), recipe


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_runs_green_in_a_fresh_workspace(recipe, tmp_path):
    shutil.copy(CI / "my_port.py", tmp_path / "my_port.py")  # the user's port, in their repo
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in command_lines((CI / recipe).read_text()):
        argv = shlex.split(command)
        done = launch.run([sys.executable, "-m", "introspect", *argv[1:]], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{recipe}: {command}\n{done.stdout}{done.stderr}"
        assert "parity holds" in done.stdout, done.stdout
        for option in ("--out", "--junit", "--json"):
            if option in argv:
                assert (tmp_path / argv[argv.index(option) + 1]).exists(), (recipe, option)
